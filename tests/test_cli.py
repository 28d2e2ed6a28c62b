"""The Typer shell: help lists the config groups, --cfg prints without running, errors are one line."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rredcot_cli.cli import app
from rredcot_cli.config.search import group_options
from rredcot_cli.errors import ArtifactError

REPO = Path(__file__).resolve().parents[1]
STAGES = ["sample", "segment", "attribute", "train", "eval", "sft"]
runner = CliRunner()


def _python(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def fake_stage(monkeypatch):
    """Replace every stage module by a recorder, so commands run nothing real."""
    calls = []
    for stage in STAGES:
        module = types.ModuleType(f"rredcot_cli.stages.{stage}")
        module.run = lambda cfg, overrides, stage=stage: calls.append((stage, cfg, overrides))
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return calls


def test_root_help_lists_stages():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for stage in STAGES:
        assert stage in result.output


@pytest.mark.parametrize("stage", STAGES)
def test_stage_help_lists_groups_and_options(stage):
    result = runner.invoke(app, [stage, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--cfg" in result.output
    for group, options in group_options().items():
        assert f"{group}:" in result.output
        for option in options:
            assert option in result.output


@pytest.mark.parametrize("flag", ["--cfg", "--print-config"])
def test_print_config_runs_nothing(flag, fake_stage, tmp_path):
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["train", f"run.dir={run_dir}", "train.steps=7", flag, "method=dr_grpo"])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.stdout)
    assert cfg["train"]["steps"] == 7 and cfg["method"]["name"] == "dr_grpo" and cfg["run"]["dir"] == str(run_dir)
    assert fake_stage == [] and not run_dir.exists()


def test_command_runs_the_stage_with_cfg_and_overrides(fake_stage, tmp_path):
    overrides = [f"run.dir={tmp_path}", "+experiment=quick", "sampling.n=3"]
    result = runner.invoke(app, ["sample", *overrides])
    assert result.exit_code == 0, result.output
    [(stage, cfg, passed)] = fake_stage
    assert stage == "sample" and passed == overrides and cfg.sampling.n == 3


def test_rredcot_errors_are_one_line_exit_2(fake_stage, monkeypatch, tmp_path):
    def fail(cfg, overrides):
        raise ArtifactError("no samples.parquet in runs/x/sample:\nrun it first")

    monkeypatch.setattr(sys.modules["rredcot_cli.stages.segment"], "run", fail)
    result = runner.invoke(app, ["segment", f"run.dir={tmp_path}"])
    assert result.exit_code == 2
    assert result.stderr == "error: no samples.parquet in runs/x/sample: run it first\n"


def test_unknown_dashed_option_is_a_config_error(fake_stage):
    result = runner.invoke(app, ["train", "--steps", "3"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: unknown option '--steps'")
    assert fake_stage == []


def test_unknown_method_in_a_real_process(tmp_path):
    result = _python("-m", "rredcot_cli", "train", "method=nonexistent", cwd=tmp_path)
    assert result.returncode == 2
    valid = ", ".join(group_options()["method"])
    assert result.stderr == f"error: unknown option 'method=nonexistent'; valid methods: {valid}\n"
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "runs").exists()


def test_import_is_light():
    heavy = ["torch", "transformers", "vllm", "pyarrow", "hydra", "omegaconf"]
    code = f"import sys, rredcot_cli.cli; print([m for m in {heavy!r} if m in sys.modules])"
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
