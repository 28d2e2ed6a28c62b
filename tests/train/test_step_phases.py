"""bench/step_phases.py on hand-written metrics: medians leave step 1 out, sums keep it."""

import json
from pathlib import Path

import pytest
from repo_scripts import load_script

from rredcot_cli.store import artifacts


@pytest.fixture(scope="module")
def step_phases():
    return load_script("bench/step_phases.py")


def _run(root: Path, seconds, sampling, credit, tokens, forward_tokens=None) -> Path:
    """A run folder whose metrics (every column; the others 0 or empty) have these per-step values."""
    schema = artifacts.get_spec("train_metrics").schema
    rows = [{**{f.name: None if f.nullable else 0 for f in schema}, "step": step, "seconds": seconds[i],
             "seconds_sampling": sampling[i], "seconds_credit": credit[i], "tokens": tokens[i],
             "credit_forward_tokens": forward_tokens[i] if forward_tokens else None}
            for i, step in enumerate(range(1, len(seconds) + 1))]
    artifacts.write_artifact("train_metrics", rows, root / "train" / "metrics.parquet")
    return root


def test_phases_and_ratios_by_hand(step_phases, tmp_path):
    base = _run(tmp_path / "a", [10.0, 4.0, 6.0], [2.0, 1.0, 3.0], [0.0, 0.0, 0.0], [10, 20, 30])
    other = _run(tmp_path / "b", [12.0, 6.0, 9.0], [2.0, 2.0, 2.0], [1.0, None, 0.5], [10, 20, 24])
    report = step_phases.main([f"grpo={base}", f"rredcot={other}", "--out", str(tmp_path / "out.json")])
    grpo, rredcot = report["runs"]["grpo"], report["runs"]["rredcot"]
    assert grpo["step_s_median"] == 5.0 and grpo["step_s_sum"] == 20.0     # median of steps 2..3
    assert grpo["generated_tokens"] == 30 and grpo["sampling_tokens_per_s"] == 5.0
    assert rredcot["credit_s_sum"] == 1.5 and rredcot["credit_over_sampling"] == 0.25   # a missing value is 0 s
    assert rredcot["step_s_median_over_grpo"] == 1.5 and rredcot["step_s_sum_over_grpo"] == 1.35
    assert json.loads((tmp_path / "out.json").read_text()) == report


def test_bad_arguments_are_one_line(step_phases, tmp_path):
    run = _run(tmp_path / "a", [1.0, 1.0], [0.5, 0.5], [0.0, 0.0], [1, 2])
    with pytest.raises(SystemExit, match="NAME=RUN_DIR"):
        step_phases.main([str(run)])
    with pytest.raises(SystemExit, match="--baseline 'x' is not one of the runs"):
        step_phases.main([f"a={run}", "--baseline", "x"])
    short = _run(tmp_path / "b", [1.0], [0.5], [0.0], [1])
    with pytest.raises(SystemExit, match="1 step"):
        step_phases.main([f"b={short}"])
    with pytest.raises(SystemExit, match="no train/metrics.parquet"):
        step_phases.main([f"c={tmp_path / 'nowhere'}"])


def test_value_estimation_positions_where_the_run_recorded_them(step_phases, tmp_path):
    run = _run(tmp_path / "a", [3.0, 3.0, 3.0], [1.0, 1.0, 1.0], [0.5, 0.0, 1.5], [1, 2, 3], [100, None, 300])
    stats = step_phases.main([f"a={run}"])["runs"]["a"]
    assert stats["steps_with_credit_work"] == 2 and stats["credit_forward_positions"] == 400
    assert stats["credit_positions_per_s"] == 200.0   # 400 positions in 2.0 s
