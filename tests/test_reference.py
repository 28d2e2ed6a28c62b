"""The generated references (docs/reference/config.md, docs/reference/methods.md) are current:
regenerated in memory from the schema and the method registry, they equal the committed files.
When this fails, run ``python scripts/gen_reference.py`` and commit what it writes."""

from repo_scripts import REPO, load_script


def test_the_generated_references_are_current():
    generator = load_script("scripts/gen_reference.py")
    stale = [path.relative_to(REPO).as_posix() for path, text in generator.references().items()
             if not path.is_file() or path.read_text() != text]
    assert not stale, f"stale: {', '.join(stale)}; run python scripts/gen_reference.py and commit the result"


def test_every_option_of_the_schema_and_every_method_is_in_the_references():
    """What the generator walks is what exists: a new schema field or method shows up by itself."""
    import dataclasses  # here: only this test walks the schema

    from rredcot_cli.config import schema
    from rredcot_cli.methods import get_method

    generator = load_script("scripts/gen_reference.py")
    config, methods = generator.config_reference(), generator.methods_reference()
    for f in dataclasses.fields(schema.TrainConfig):
        assert f"`train.{f.name}`" in config
    for name in generator._builtin_methods():
        assert f"## {name}\n" in methods
        assert all(f"`{o.name}`" in methods for o in get_method(name).options())
    assert "rredcot" in generator._builtin_methods() and "grpo" in generator._builtin_methods()
