"""bench/credit_vs_outcome.py on a hand-written saved batch: shares and push ratios by hand."""

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/credit_vs_outcome.py")


def _write(path: Path, columns: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def _batch(step: Path) -> None:
    # Group "a" is mixed (rewards 1, 0): GRPO gives +-0.5 / std = +-1/sqrt(2) (Bessel std of {1, 0}).
    # Group "b" is uniform: left out. a/0 has two segments of two tokens, the second with zero credit;
    # a/1 has one segment of three tokens.
    _write(step / "sample" / "samples.parquet", {
        "prompt_id": ["a", "a", "b", "b"], "sample_idx": [0, 1, 0, 1], "reward": [1.0, 0.0, 1.0, 1.0]})
    _write(step / "segment" / "segments.parquet", {
        "prompt_id": ["a", "a", "a", "b", "b"], "sample_idx": [0, 0, 1, 0, 1],
        "token_start": [0, 2, 0, 0, 0], "token_end": [2, 4, 3, 1, 1]})
    _write(step / "attribute" / "rredcot" / "advantages.parquet", {
        "prompt_id": ["a", "a", "b", "b"], "sample_idx": [0, 1, 0, 1],
        "token_advantages": [[0.5, 0.5, 0.0, 0.0], [-1.0, -1.0, -1.0], [0.0], [0.0]]})


def test_shares_and_push_ratios_by_hand(bench, tmp_path):
    _batch(tmp_path / "run" / "train" / "rollouts" / "step-000001")
    (stats,) = bench.main([str(tmp_path / "run")])["runs"]
    grpo = 1 / math.sqrt(2)
    assert stats["completions_in_mixed_groups"] == 2 and stats["multi_segment_share"] == 0.5
    assert stats["segments_of_multi_segment_completions"] == 2
    assert stats["opposite_sign_segments"] == 0.0 and stats["zero_segments"] == 0.5
    assert stats["push_ratio_multi_segment"]["median"] == round(1.0 / (grpo * 4), 4)     # 0.3536
    assert stats["push_ratio_one_segment"]["median"] == round(-3.0 / (-grpo * 3), 4)   # 1.4142


def test_a_flipped_segment_is_counted(bench, tmp_path):
    step = tmp_path / "run" / "train" / "rollouts" / "step-000001"
    _batch(step)
    _write(step / "attribute" / "rredcot" / "advantages.parquet", {
        "prompt_id": ["a", "a", "b", "b"], "sample_idx": [0, 1, 0, 1],
        "token_advantages": [[0.5, 0.5, -0.2, -0.2], [-1.0, -1.0, -1.0], [0.0], [0.0]]})
    (stats,) = bench.main([str(tmp_path / "run")])["runs"]
    assert stats["opposite_sign_segments"] == 0.5 and stats["zero_segments"] == 0.0


def test_a_run_without_rollouts_is_one_line(bench, tmp_path):
    (tmp_path / "run" / "train").mkdir(parents=True)
    with pytest.raises(SystemExit, match="train.save_rollouts"):
        bench.main([str(tmp_path / "run")])


def test_rewards_by_kind_of_answer_cover_every_group(bench, tmp_path):
    _batch(tmp_path / "run" / "train" / "rollouts" / "step-000001")
    (stats,) = bench.main([str(tmp_path / "run")])["runs"]
    assert stats["reward_multi_segment"] == {"n": 1, "mean": 1.0}          # a/0
    assert stats["reward_one_segment"] == {"n": 3, "mean": round(2 / 3, 4)}   # a/1, b/0, b/1
