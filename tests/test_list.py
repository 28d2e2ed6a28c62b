"""What exists can be found from the CLI (issue 38, item 7): ``rredcot --version``, ``rredcot list
methods|segmenters|benchmarks|models`` with one line each, ``rredcot list methods NAME`` with each
option's type or choices, default and meaning (from the params dataclass), help texts that list
choices made from the registries, and config comments that name only options that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from rredcot_cli.cli import app
from rredcot_cli.config.search import group_options
from rredcot_cli.methods import get_method, method_names
from rredcot_cli.segmenters import SEGMENTERS

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def rredcot(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def rows(stdout: str) -> dict[str, str]:
    """``name  text`` lines -> {name: text}."""
    return dict(line.split(None, 1) for line in stdout.splitlines())


def test_version():
    code, out, _ = rredcot("--version")
    assert code == 0
    assert out == "rredcot 0.1.0\n"  # pyproject.toml's version


def test_list_methods_one_line_each():
    code, out, _ = rredcot("list", "methods")
    assert code == 0
    listed = rows(out)
    assert list(listed) == method_names()
    assert listed["rredcot"] == "RREDCoT: segment-level reward redistribution from the model's own value estimates."
    assert listed["grpo"] == "GRPO outcome advantage."
    assert listed["mc"] == "VinePPO-style Monte Carlo state values."
    assert all(listed.values())


def test_list_segmenters_one_line_each():
    code, out, _ = rredcot("list", "segmenters")
    assert code == 0
    listed = rows(out)
    assert list(listed) == ["entropy", "fixed", "hybrid", "keyword", "newline"]
    assert listed["fixed"] == "Every `tokens` tokens; the remainder joins the last segment if shorter than min_tokens."
    assert listed["hybrid"] == "Keyword-entropy segmentation."


def test_list_benchmarks_and_models_one_line_each():
    code, out, _ = rredcot("list", "benchmarks")
    assert code == 0
    listed = rows(out)
    assert list(listed) == group_options()["benchmark"]
    assert listed["chain"] == "Synthetic chained mod-10 arithmetic: one computed step per line; the first wrong step is known."
    assert listed["gsm8k"] == "GSM8K; path null = the copy shipped with the package."
    code, out, _ = rredcot("list", "model")  # the singular works too
    assert code == 0
    listed = rows(out)
    assert list(listed) == group_options()["model"]
    assert listed["tiny"] == "The tiny character-level Llama-architecture model shipped inside the package. (path: embedded)"
    assert listed["qwen2.5-0.5b-instruct"] == "path: Qwen/Qwen2.5-0.5B-Instruct"
    assert listed["qwen2.5-math-1.5b"] == ("Base model, as in Dr. GRPO / SimpleRL-Zoo: prompts are plain text "
                                          "templates. (path: Qwen/Qwen2.5-Math-1.5B)")


def test_list_a_method_shows_its_options():
    code, out, _ = rredcot("list", "methods", "rredcot")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "method=rredcot: RREDCoT: segment-level reward redistribution from the model's own value estimates."
    at = lines.index("  method.advantage=immediate  (one of: immediate, reward_to_go, mixed)")
    assert lines[at + 1] == "      how segment rewards become token advantages (module docstring)"
    assert "  method.mix_lambda=1.0  (float, >= 0)" in lines
    assert "  method.probe_template=null  (str or null)" in lines
    assert "  method.is_self_normalised=false  (bool)" in lines
    # The estimators are another registry's names, plugins' included.
    assert "  method.value=answer_probe  (one of: answer_probe, answer_share, suffix_is)" in lines
    code, out, _ = rredcot("list", "methods", "rloo")
    assert out == "method=rloo: RLOO: REINFORCE with a leave-one-out baseline.\n  (no options)\n"


def test_list_a_preset_prints_its_file_with_comments():
    code, out, _ = rredcot("list", "segmenters", "fixed")
    assert code == 0
    assert out.splitlines()[1:] == ["# Fixed-length segments of `tokens` tokens.", "name: fixed", "tokens: 32"]


@pytest.mark.parametrize("args, line", [
    (["list", "methods", "RREDCoT"], "error: no method named 'RREDCoT'; did you mean rredcot? Valid: "),
    (["list", "modles"], "error: rredcot list modles: nothing to list by that name; did you mean models? "
                         "Valid: methods, segmenters, benchmarks, models"),
    (["list", "models", "tiny2"], "error: no model named 'tiny2'; did you mean tiny? Valid: "),
])
def test_list_mistakes_are_one_line(args, line):
    code, _, err = rredcot(*args)
    assert code == 2
    assert err.startswith(line) and err.count("\n") == 1, err


@pytest.mark.parametrize("name", method_names())
def test_every_builtin_method_option_says_what_it_means(name):
    """The convention: a comment on a params field's line (or right above it) is its help."""
    missing = [option.name for option in get_method(name).options() if not option.help]
    assert not missing, f"method {name}: comment these fields of {get_method(name).params.__name__}: {missing}"


def test_segment_help_lists_every_segmenter():
    text = get_command(app).commands["segment"].help
    assert f"segment={'|'.join(sorted(SEGMENTERS))}" in text
    assert sorted(SEGMENTERS) == ["entropy", "fixed", "hybrid", "keyword", "newline"]


def test_config_comments_name_only_options_that_exist():
    """Usage lines in the packaged configs (``rredcot train model=... benchmark=...``) name group
    options that exist (the SmolLM2 preset named a benchmark add_small that never did)."""
    groups = group_options()
    wrong = []
    for path in sorted((REPO / "conf").rglob("*.yaml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            comment = line.partition("#")[2]
            for group, option in re.findall(rf"(?<![\w.])({'|'.join(groups)})=([\w.\-]*\w)", comment):
                if option not in groups[group] and option.lower() != "name":  # "experiment=name": a placeholder
                    wrong.append(f"{path.relative_to(REPO)}:{number}: {group}={option}")
    assert not wrong, wrong
