"""Stricter inputs (issue 14): the bad inputs a new user tries fail in one `error:` line with exit
status 2 and leave nothing behind, before any model is loaded:

- a numeric option outside its meaningful range (every entry of schema.RANGES and of every
  method's declared ranges gets one out-of-range value);
- a model path that exists but holds no model, or a benchmark data path that holds no data;
- empty work: an input artifact with no rows, or a request for zero problems.

None of these tests loads a model: they fail before one would be loaded.
"""

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from rredcot_cli.store import artifacts
from rredcot_cli.cli import app
from rredcot_cli.config.compose import compose
from rredcot_cli.config.messages import schema_type
from rredcot_cli.config.ranges import parse_range
from rredcot_cli.config.search import group_options
from rredcot_cli.errors import ConfigError
from rredcot_cli.methods import get_method, method_names
from rredcot_cli.config.schema import DIVISIBLE_BY, RANGES, Config

runner = CliRunner()


def rredcot(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stderr


def one_error_line(stderr):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def _numeric(tp) -> bool:
    """int/float, Optional of one, or a list of them (bool excluded)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, list, typing.List):
        return any(_numeric(a) for a in args if a is not type(None))
    return tp in (int, float)


def _numeric_fields(tp, prefix=""):
    for name, field_type in typing.get_type_hints(tp).items():
        if dataclasses.is_dataclass(field_type):
            yield from _numeric_fields(field_type, f"{prefix}{name}.")
        elif _numeric(field_type):
            yield f"{prefix}{name}"


# --------------------------------------------------------------------------- the tables


def test_every_numeric_option_has_a_range():
    numeric = set(_numeric_fields(Config))
    missing = sorted(numeric - set(RANGES))
    assert not missing, f"give these a range (setting(..., range=...)) in rredcot_cli/config/schema.py: {missing}"
    unknown = sorted(set(RANGES) - numeric)
    assert not unknown, f"RANGES names options the schema has not (or not numeric): {unknown}"
    for key, spec in RANGES.items():
        rng = parse_range(spec)
        for bound in (rng.low, rng.high):
            assert not isinstance(bound, str) or bound in numeric, (key, bound)
    for key, divisor in DIVISIBLE_BY:
        assert {key, divisor} <= numeric


@pytest.mark.parametrize("name", method_names())
def test_every_numeric_method_parameter_has_a_range(name):
    spec = get_method(name)
    hints = typing.get_type_hints(spec.params)
    numeric = {k for k in spec.param_names() if _numeric(hints[k])}
    assert numeric <= set(spec.ranges), f"method {name}: give {sorted(numeric - set(spec.ranges))} a range"
    assert set(spec.ranges) <= numeric, f"method {name}: ranges for unknown parameters"
    for key, text in spec.ranges.items():
        rng = parse_range(text)
        for bound in (rng.low, rng.high):
            assert not isinstance(bound, str) or bound in numeric, (name, key, bound)


EXPERIMENTS = [None, *group_options()["experiment"]]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_preset_with_every_method_is_in_range(experiment):
    """No shipped preset is refused: every experiment with every method option (and every other
    group's options, one at a time) composes through the range checks."""
    base = [f"experiment={experiment}"] if experiment else []
    for method in group_options()["method"]:
        try:
            compose([*base, f"method={method}"])
        except ConfigError as e:  # a preset made for one method (experiment=dapo sets method.max_length)
            assert str(e).startswith("unknown key 'method."), e
    for group, options in group_options().items():
        if group not in ("experiment", "method"):
            for option in options:
                compose([*base, f"{group}={option}"])


@pytest.mark.parametrize("spec, value, ok", [
    (">= 1", 1, True), (">= 1", 0, False), ("> 0", 0.0, False), ("> 0", 1e-9, True),
    ("(0, 1]", 1.0, True), ("(0, 1]", 0.0, False), ("[0, 1)", 1.0, False), ("[0, 1)", 0.0, True),
    ("<= 2", 3, False), ("< 2", 2, False), (">= 0", None, True), (">= 0", float("nan"), False),
    ("[0, 1)", [0.5, 0.9], True), ("[0, 1)", [0.5, 1.5], False),
])
def test_range_specs(spec, value, ok):
    from rredcot_cli.config.ranges import range_error

    assert (range_error("k", value, spec, lambda name: None) is None) == ok


# --------------------------------------------------------------------------- class (a): numeric ranges


def _outside(spec: str, type_) -> str:
    """An override value outside ``spec`` of the given schema type (int, float, list of them)."""
    rng = parse_range(spec)
    if isinstance(rng.low, float):
        value = rng.low if rng.low_open else rng.low - 1
    else:
        value = rng.high if rng.high_open else rng.high + 1
    is_int = int in (typing.get_args(type_) or (type_,)) or type_ is int
    text = str(int(value)) if is_int else repr(float(value))
    return f"[{text}]" if typing.get_origin(type_) in (list, typing.List) else text


CONFIG_CASES = [(key, _outside(spec, schema_type(key))) for key, spec in RANGES.items()]
METHOD_CASES = [
    (name, key, _outside(text, typing.get_type_hints(get_method(name).params)[key]))
    for name in method_names() for key, text in get_method(name).ranges.items()
]


@pytest.mark.parametrize("key, value", CONFIG_CASES, ids=[f"{k}={v}" for k, v in CONFIG_CASES])
def test_an_out_of_range_option_fails_in_one_line(tmp_path, key, value):
    run = tmp_path / "run"
    code, stderr = rredcot("sample", f"run.dir={run}", f"{key}={value}")
    assert code == 2
    line = one_error_line(stderr)
    assert line.startswith(f"error: {key}=") and "must be " in line, line
    assert not run.exists()


@pytest.mark.parametrize("method, key, value", METHOD_CASES, ids=[f"{m}.{k}={v}" for m, k, v in METHOD_CASES])
def test_an_out_of_range_method_parameter_fails_in_one_line(tmp_path, method, key, value):
    run = tmp_path / "run"
    code, stderr = rredcot("train", f"run.dir={run}", f"method={method}", f"method.{key}={value}")
    assert code == 2
    line = one_error_line(stderr)
    assert line.startswith(f"error: method.{key}=") and "must be " in line, line
    assert not run.exists()


@pytest.mark.parametrize("overrides, message", [
    (["sampling.top_p=1.5"], "sampling.top_p=1.5: must be in (0, 1]"),
    (["train.lr=0"], "train.lr=0.0: must be > 0"),
    (["eval.n=2"], "eval.k=[1, 4, 8]: each entry must be in [1, eval.n] (eval.n=2; pass@k and maj@k take k of "
                   "the n samples)"),
    (["benchmark.min_steps=20"], "benchmark.min_steps=20: must be in [1, benchmark.max_steps] "
                                 "(benchmark.max_steps=12)"),
    (["method=dapo", "method.cache_length=300"],
     "method.cache_length=300: must be in [0, method.max_length] (method.max_length=256)"),
    (["method=cort", "method.lam=1"], "method.lam=1.0: must be in [0, 1) (weights 1 + lam*tanh(z) must stay positive)"),
    (["sft.num_heads=3"], "sft.hidden_size=128: must be a multiple of sft.num_heads=3"),
    (["sample.num_prompts=0"], "sample.num_prompts=0: must be >= 1 (nothing to sample otherwise)"),
    (["eval.num_problems=0"], "eval.num_problems=0: must be >= 1 (nothing to evaluate otherwise)"),
])
def test_range_messages(tmp_path, overrides, message):
    code, stderr = rredcot("eval", f"run.dir={tmp_path / 'run'}", *overrides)
    assert code == 2
    assert one_error_line(stderr) == f"error: {message}"
    assert not (tmp_path / "run").exists()


def test_a_preset_value_out_of_range_is_named_too(tmp_path):
    # experiment=quick sets eval.n=2 and eval.k=[1,2]; a larger k on top is refused before anything runs.
    code, stderr = rredcot("eval", f"run.dir={tmp_path}", "experiment=quick", "eval.k=[1,4]")
    assert code == 2
    assert one_error_line(stderr).startswith("error: eval.k=[1, 4]: each entry must be in [1, eval.n] (eval.n=2")


# --------------------------------------------------------------------------- class (b): paths without a model


def _model_folders(tmp_path):
    from rredcot_cli.policy.models import EMBEDDED_DIR

    empty = tmp_path / "empty"
    empty.mkdir()
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((EMBEDDED_DIR / "config.json").read_bytes())
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).symlink_to(EMBEDDED_DIR / name)
    file = tmp_path / "model.safetensors"
    file.symlink_to(EMBEDDED_DIR / "model.safetensors")
    return {
        "empty": (empty, "no model in this folder: it has no config.json, no weights"),
        "config-only": (config_only, "no model in this folder: it has no weights"),
        "no-tokenizer": (no_tokenizer, "no model in this folder: it has no tokenizer"),
        "file": (file, "is a file, not a model folder"),
        "missing": (tmp_path / "no" / "such" / "model", "no such folder"),
    }


MODEL_CASES = ["empty", "config-only", "no-tokenizer", "file", "missing"]


@pytest.mark.parametrize("stage", ["sample", "eval", "train", "segment", "judge"])
@pytest.mark.parametrize("case", MODEL_CASES)
def test_a_path_without_a_model_fails_in_one_line(tmp_path, stage, case):
    path, fragment = _model_folders(tmp_path)[case]
    run = tmp_path / "run"
    if stage == "segment" and case in ("empty", "config-only"):
        fragment = "no model in this folder: it has no tokenizer"  # segment=newline reads only the tokenizer
    code, stderr = rredcot(stage, f"run.dir={run}", f"model.path={path}")
    assert code == 2
    line = one_error_line(stderr)
    assert line.startswith(f"error: model.path={path}") and fragment in line, line
    assert "a checkpoint such as runs/<run>/train/checkpoints/final, a GGUF file, or a hub id" in line
    assert not run.exists()


def test_a_model_folder_below_the_given_one_is_suggested(tmp_path):
    from rredcot_cli.policy.models import EMBEDDED_DIR

    nested = tmp_path / "run" / "train" / "checkpoints" / "final"
    nested.mkdir(parents=True)
    for item in EMBEDDED_DIR.iterdir():
        (nested / item.name).symlink_to(item)
    code, stderr = rredcot("eval", f"run.dir={tmp_path / 'eval-run'}", f"model.path={tmp_path / 'run'}")
    assert code == 2
    assert f"(a model is in {nested}: pass that folder)" in one_error_line(stderr)


def test_attribute_checks_the_model_only_for_model_based_methods(tmp_path):
    code, stderr = rredcot("attribute", f"run.dir={tmp_path}", "method=rredcot", f"model.path={tmp_path}")
    assert code == 2 and "no model in this folder" in one_error_line(stderr)
    code, stderr = rredcot("attribute", f"run.dir={tmp_path}", "method=grpo", f"model.path={tmp_path}")
    assert code == 2 and "no samples.parquet in" in one_error_line(stderr)  # the model is not needed


def test_a_batch_size_only_vllm_takes_is_refused_before_the_run_folder(tmp_path):
    code, stderr = rredcot("sample", f"run.dir={tmp_path / 'run'}", "backend.batch_size=0")
    assert code == 2
    assert one_error_line(stderr).startswith("error: backend.batch_size=0: the hf backend needs at least 1 sequence")
    assert not (tmp_path / "run").exists()


def test_a_missing_critic_is_refused_before_the_run_folder(tmp_path):
    code, stderr = rredcot("train", f"run.dir={tmp_path / 'run'}", "method=ppo", "critic.init=nowhere/critic.pt")
    assert code == 2
    assert one_error_line(stderr).startswith("error: critic.init=nowhere/critic.pt: no such file")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case, fragment", [
    ("missing", "no such file or folder"),
    ("empty-file", "is an empty file; nothing to draw problems from"),
    ("folder", "has no test.jsonl, test.json or test.parquet"),
    ("synthetic", "benchmark chain is generated, it takes no path"),
])
def test_a_benchmark_path_without_data_fails_in_one_line(tmp_path, case, fragment):
    paths = {"missing": tmp_path / "nope" / "data.jsonl", "empty-file": tmp_path / "empty.jsonl",
             "folder": tmp_path / "data", "synthetic": tmp_path / "empty.jsonl"}
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    benchmark = "benchmark=chain" if case == "synthetic" else "benchmark=gsm8k"
    run = tmp_path / "run"
    code, stderr = rredcot("sample", f"run.dir={run}", benchmark, f"benchmark.path={paths[case]}")
    assert code == 2
    line = one_error_line(stderr)
    assert fragment in line, line
    assert not run.exists()


# --------------------------------------------------------------------------- class (c): empty work


def _empty_inputs(tmp_path):
    paths = {}
    for kind in ("samples", "segments", "credits", "advantages"):
        paths[kind] = artifacts.write_artifact(kind, [], tmp_path / "in" / f"{kind}.parquet")
    return paths


@pytest.mark.parametrize("stage, extra", [
    ("segment", []),
    ("attribute", ["method=grpo"]),
    ("heatmap", ["method=grpo"]),
    ("judge", ["judge.methods=[grpo]"]),
])
def test_an_input_with_no_rows_is_refused(tmp_path, stage, extra):
    paths = _empty_inputs(tmp_path)
    run = tmp_path / "run"
    inputs = [f"inputs.{kind}={path}" for kind, path in paths.items()]
    code, stderr = rredcot(stage, f"run.dir={run}", *extra, *inputs)
    assert code == 2
    line = one_error_line(stderr)
    assert line.startswith(f"error: input samples {paths['samples']} holds no rows: nothing to {stage}"), line
    assert not run.exists()


def test_a_stage_that_fails_before_writing_output_leaves_no_folder(tmp_path):
    # A data file that is not empty but holds no rows is only found out when the stage reads it.
    data = tmp_path / "blank.jsonl"
    data.write_text("\n  \n")
    run = tmp_path / "run"
    code, stderr = rredcot("sample", f"run.dir={run}", "benchmark=gsm8k", f"benchmark.path={data}")
    assert code == 2
    assert "has no rows" in one_error_line(stderr)
    assert not run.exists()
    # A run dir that existed before keeps everything it held; only the new stage folder goes.
    (run / "segment").mkdir(parents=True)
    (run / "segment" / "notes.txt").write_text("keep me")
    code, stderr = rredcot("sample", f"run.dir={run}", "benchmark=gsm8k", f"benchmark.path={data}")
    assert code == 2
    assert sorted(p.name for p in run.iterdir()) == ["segment"]
    assert (run / "segment" / "notes.txt").read_text() == "keep me"
