"""A method option with a fixed set of values (a ``Literal[...]`` field of the method's params
dataclass) is checked when the config is composed, for every registered method, plugins included:
one ``error:`` line naming the option, the bad value and the valid ones, exit 2, no folder."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from rredcot_cli.cli import app
from rredcot_cli.config.compose import compose
from rredcot_cli.errors import ConfigError
from rredcot_cli.methods import get_method, method_names

runner = CliRunner()

CHOICE_CASES = [(name, key, allowed) for name in method_names() for key, allowed in get_method(name).choices().items()]

PLUGIN = '''
from dataclasses import dataclass
from typing import Literal

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit


@dataclass
class ChoosyParams:
    mode: Literal["fast", "slow"] = "fast"  # how hard to think


@register("choosy_test_plugin", params=ChoosyParams)
def choosy(batch, *, mode):
    """A test plugin whose one option has two values."""
    zeros = torch.zeros(batch.segment_ids.shape)
    return Credit(token_advantages=zeros, segment_values=zeros, segment_credits=zeros)
'''


def test_the_issue_examples_are_one_line_exit_2_and_no_folder(tmp_path):
    run = tmp_path / "demo"
    for args, line in [
        (["attribute", "method=rredcot", "method.value=foo"],
         "error: method.value=foo: not a valid choice; valid: answer_probe, answer_share, suffix_is"),
        (["train", "method=rredcot", "method.advantage=reward2go"],
         "error: method.advantage=reward2go: not a valid choice; did you mean reward_to_go? "
         "Valid: immediate, reward_to_go, mixed"),
    ]:
        result = runner.invoke(app, [*args, f"run.dir={run}"])
        assert result.exit_code == 2, result.output
        assert result.stderr == line + "\n"
        assert not run.exists()


def test_rredcot_and_mc_declare_their_choices():
    """Hand-checked against the module docstrings: the advantage rules, estimators and baselines."""
    assert get_method("rredcot").choices() == {
        "value": ("answer_probe", "answer_share", "suffix_is"),
        "advantage": ("immediate", "reward_to_go", "mixed"),
        "baseline": ("group_mean", "estimator"),
        "is_boundaries": ("matched", "all"),
        "is_window_unit": ("segments", "tokens"),
        "probe_scoring": ("auto", "kv_cache", "packed"),
    }
    assert get_method("mc").choices()["advantage"] == ("vineppo", "immediate", "reward_to_go", "mixed")


@pytest.mark.parametrize("name, key, allowed", CHOICE_CASES, ids=[f"{n}.{k}" for n, k, _ in CHOICE_CASES])
def test_every_choice_of_every_method_is_checked(name, key, allowed):
    with pytest.raises(ConfigError) as caught:
        compose([f"method={name}", f"method.{key}=no_such_choice"])
    valid = ", ".join(map(str, allowed))
    assert str(caught.value).startswith(f"method.{key}=no_such_choice: not a valid choice"), caught.value
    assert str(caught.value).endswith(valid)
    for value in allowed:  # and every valid value composes
        assert compose([f"method={name}", f"method.{key}={value}"]).method[key] == value


def test_judge_params_are_checked_too():
    from rredcot_cli.stages.judge import method_params

    with pytest.raises(ConfigError, match=r"^judge\.params\.mc\.baseline=grop_mean: not a valid choice; "
                                          r"did you mean group_mean\? Valid: mc, group_mean$"):
        method_params("mc", {"baseline": "grop_mean"})


@pytest.fixture
def isolated_registry(monkeypatch):
    """The plugin's method is forgotten after the test (the registry and the plugin bookkeeping
    are copies), so other tests see only the built-in methods."""
    from rredcot_cli import methods, plugins

    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))
    monkeypatch.setattr(plugins, "_IMPORTED", dict(plugins._IMPORTED))
    monkeypatch.setattr(plugins, "_IMPORTED_OPTIONS", {group: set(names) for group, names in
                                                       plugins._IMPORTED_OPTIONS.items()})


def test_a_plugin_methods_literal_option_is_checked_and_listed(tmp_path, isolated_registry):
    plugin = tmp_path / "choosy.py"
    plugin.write_text(PLUGIN)
    base = [f"plugins=[{plugin}]", "method=choosy_test_plugin"]
    assert compose([*base, "method.mode=slow"]).method.mode == "slow"
    with pytest.raises(ConfigError, match=r"^method\.mode=slwo: not a valid choice; did you mean slow\? "
                                          r"Valid: fast, slow$"):
        compose([*base, "method.mode=slwo"])
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", *base, "method.mode=medium", f"run.dir={run}"])
    assert result.exit_code == 2
    assert result.stderr == "error: method.mode=medium: not a valid choice; valid: fast, slow\n"
    assert not run.exists()
    listed = runner.invoke(app, ["list", "methods", "choosy_test_plugin"])
    assert listed.stdout.splitlines() == [
        "method=choosy_test_plugin: A test plugin whose one option has two values.",
        "options (set with method.KEY=VALUE; shown with their defaults):",
        "  method.mode=fast  (one of: fast, slow)",
        "      how hard to think",
    ]


def test_an_optional_literal_also_allows_null():
    from rredcot_cli.methods._options import choices, plain_params

    @dataclasses.dataclass
    class Params:
        pick: typing.Optional[typing.Literal["a", "b"]] = None
        count: int = 1

    assert choices(Params) == {"pick": ("a", "b", None)}
    plain = typing.get_type_hints(plain_params(Params))
    assert plain == {"pick": typing.Optional[str], "count": int}  # what OmegaConf accepts


def test_suggestions_ignore_case():
    with pytest.raises(ConfigError, match="^unknown option 'method=RREDCoT'; did you mean rredcot\\? Valid methods: "):
        compose(["method=RREDCoT"])
