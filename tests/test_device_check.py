"""bench/device_check.py, the accelerator check run in one short GPU lease: the wall-clock guard
and what it writes when a part is skipped or cut short (everywhere), the per-step and per-phase
figures, and the 1.5B RL part end to end on the CPU build of vLLM with the config narrowed
(``-m vllm``, CI's vLLM lane)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo_scripts import REPO, load_script

device_check = load_script("bench/device_check.py")


def test_a_part_whose_estimate_no_longer_fits_is_skipped_and_says_why(tmp_path):
    out = tmp_path / "dc.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "device_check.py"), "--quick", "--budget-s", "30",
                           "--only", "model_1p5b", "grpo_1p5b", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["budget_s"] == 30
    assert set(result["parts"]) == {"model_1p5b", "grpo_1p5b"}  # --only: the others are not named
    for name in ("model_1p5b", "grpo_1p5b"):
        part = result["parts"][name]
        assert part["status"] == "skipped"
        if name == "model_1p5b":  # needs no vLLM: only the guard stops it (estimate 45 s > 30 s)
            assert "over the" in part["why"] and "--budget-s 30" in part["why"], part["why"]


def test_skip_reason_names_the_missing_vllm_before_the_budget():
    part = device_check.Part("grpo_1p5b", lambda left: {}, estimate_s=150)
    assert "pip install" in device_check.skip_reason(part, 1000, 1000, has_vllm=False)
    assert "over the 100 s left of --budget-s 480" in device_check.skip_reason(part, 100, 480, has_vllm=True)
    assert device_check.skip_reason(part, 151, 480, has_vllm=True) is None
    no_vllm = device_check.Part("memory", lambda left: {}, estimate_s=40, needs_vllm=False)
    assert device_check.skip_reason(no_vllm, 41, 480, has_vllm=False) is None


def test_an_unknown_part_is_refused_with_the_valid_names(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "device_check.py"), "--only", "rredcot",
                           "--out", str(tmp_path / "dc.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "rredcot_1p5b" in proc.stderr and not (tmp_path / "dc.json").exists()


def _step(step, tokens, **seconds):
    """A step as measure.train_steps reads it from a run's metrics."""
    from rredcot_cli.store.artifacts import PHASES

    row = {"step": step, "seconds": sum(seconds.values()), "reward_mean": 0.5, "loss": 0.1, "grad_norm": 1.0,
           "sampler_kl": 0.0, "credit_forward_tokens": 3000}
    return {"row": row, "tokens": tokens, "phases": {name: seconds.get(name, 0.0) for name in PHASES}}


def test_step_figures_rate_each_phase_by_what_it_processed():
    steps = [_step(1, 1000, sampling=2.0, credit=1.0, update=4.0, refresh=0.5),
             _step(2, 2000, sampling=4.0, credit=2.0, old_logprobs=1.0, update=5.0, refresh=0.25, segment=0.1)]
    figures = device_check.step_figures(steps, weight_bytes=2**31)
    rates = figures[1]["rates"]
    assert rates["sampling_tokens_per_s"] == 500.0  # 2000 generated / 4 s
    assert rates["credit_tokens_per_s"] == 1500.0  # the credit method's 3000 forward positions / 2 s
    assert rates["old_logprobs_tokens_per_s"] == 2000.0
    assert rates["update_tokens_per_s"] == 400.0
    assert rates["refresh_weights_gib_per_s"] == 8.0  # 2 GiB synced in 0.25 s
    assert not any(key.startswith("segment") for key in rates)
    assert figures[0]["rates"]["old_logprobs_tokens_per_s"] is None  # a phase that did not run
    assert figures[1]["phases"]["update"] == 5.0 and figures[1]["tokens"] == 2000


def test_a_run_cut_short_by_the_budget_still_reports(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")  # the child is stopped long before it reads it
    run = tmp_path / "runs" / "grpo"
    report = device_check.check_rl_1p5b("grpo", model_dir, run, "cpu", quick=True, left_s=0.5)
    assert report["status"] == "cut short" and report["ended"].startswith("cut short by --budget-s")
    assert report["steps"] == [] and report["after_warmup"] is None and report["phase_memory"] is None
    assert run.is_dir()


def test_phase_memory_writes_each_phase_when_it_closes_nested_ones_included(tmp_path):
    out = tmp_path / "memory.json"
    watch = device_check.PhaseMemory(out)
    watch.observe("begin", "sampling")
    watch.observe("end", "sampling")
    assert set(json.loads(out.read_text())) == {"sampling"}
    watch.observe("begin", "update")
    watch.observe("begin", "old_logprobs")
    watch.observe("end", "old_logprobs")
    watch.observe("end", "update")
    written = json.loads(out.read_text())
    assert set(written) == {"sampling", "update", "old_logprobs"}
    assert all(figures and all(v > 0 for v in figures.values()) for figures in written.values())


@pytest.mark.vllm
def test_the_1p5b_rl_part_runs_on_the_narrowed_config(tmp_path):
    pytest.importorskip("vllm")
    model_dir = tmp_path / "work" / "qwen2.5-math-1.5b-random"
    built = device_check.build_model_1p5b(model_dir, "cpu", quick=True)
    assert built["parameters"] > 0 and (model_dir.parent / device_check.QUESTIONS).is_file()
    report = device_check.check_rl_1p5b("rredcot", model_dir, tmp_path / "runs" / "rredcot", "cpu", quick=True,
                                        left_s=float("inf"))
    assert report["ended"] == "ok", report.get("stderr_tail")
    assert [s["step"] for s in report["steps"]] == [1, 2] and report["after_warmup"]["steps_averaged"] == [2]
    for step in report["steps"]:
        assert step["tokens"] == 2 * 2 * 16  # random weights never stop: every completion to the budget
        assert step["credit_forward_tokens"] > 0  # RREDCoT valued its boundaries
        for phase in ("sampling", "credit", "old_logprobs", "update", "refresh"):
            assert step["phases"][phase] > 0, (step["step"], phase)
        assert step["rates"]["sampling_tokens_per_s"] > 0 and step["rates"]["refresh_weights_gib_per_s"] > 0
    assert {"sampling", "credit", "update", "refresh"} <= set(report["phase_memory"])
    assert not (tmp_path / "runs" / "rredcot" / "train" / "checkpoints").exists()  # GBs at the real size
