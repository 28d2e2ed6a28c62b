"""bench/value_vs_outcome.py on hand-made artifacts: the shares it reports, and the judge's
agreement of a credits file beside the two controls."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from repo_scripts import load_script

bench = load_script("bench/value_vs_outcome.py")

# Prompt a: rewards 1, 0, 0 (mixed, baseline 1/3); prompt b: rewards 1, 1 (uniform, left out).
SAMPLES = [{"prompt_id": p, "sample_idx": i, "reward": r}
           for p, i, r in [("a", 0, 1.0), ("a", 1, 0.0), ("a", 2, 0.0), ("b", 0, 1.0), ("b", 1, 1.0)]]


def credits(first_values):
    """a#0 and a#1 have two segments (V(S_1) as given, last value the reward), a#2 and b have one."""
    rows = []
    for idx, (v1, reward) in enumerate(zip(first_values, (1.0, 0.0))):
        rows += [{"prompt_id": "a", "sample_idx": idx, "segment_idx": 0, "value": v1, "credit": v1 - 1 / 3},
                 {"prompt_id": "a", "sample_idx": idx, "segment_idx": 1, "value": reward, "credit": reward - v1}]
    rows.append({"prompt_id": "a", "sample_idx": 2, "segment_idx": 0, "value": 0.0, "credit": -1 / 3})
    rows += [{"prompt_id": "b", "sample_idx": i, "segment_idx": 0, "value": 1.0, "credit": 0.0} for i in (0, 1)]
    return rows


def test_shares_hand_computed():
    # a#0: V(S_1) = 0.97, within 0.05 of its reward 1 and far from 1/3; a#1: V(S_1) = 1/3 + 0.01,
    # near the baseline and 0.34 from its reward 0; neither gives its second segment zero credit.
    result = bench.summary(SAMPLES, credits([0.97, 1 / 3 + 0.01]), batches=1)
    assert result["completions"] == 2
    assert result["own_reward_share"] == 0.5 and result["off_baseline_share"] == 0.5
    assert result["later_zero_share"] == 0.0
    # The value that copies the outcome: both within 0.05, both off the baseline, every later
    # credit zero.
    copied = bench.summary(SAMPLES, credits([1.0, 0.0]), batches=1)
    assert (copied["own_reward_share"], copied["off_baseline_share"], copied["later_zero_share"]) == (1.0, 1.0, 1.0)


def test_agreement_beside_the_controls(tmp_path):
    """With a reference equal to the method's own values, its inner agreement is 1 (two inner
    values: a#0's 0.9 and a#1's 0.1 against the same); the outcome control copies 1 and 0 (rank
    agreement 1 too, but nothing within one reward); the baseline control is constant (undefined)."""
    reference = tmp_path / "ref.parquet"
    rows = [{"prompt_id": "a", "sample_idx": 0, "values": [1 / 3, 0.9, 1.0]},
            {"prompt_id": "a", "sample_idx": 1, "values": [1 / 3, 0.1, 0.0]},
            {"prompt_id": "a", "sample_idx": 2, "values": [1 / 3, 0.0]},
            {"prompt_id": "b", "sample_idx": 0, "values": [1.0, 1.0]},
            {"prompt_id": "b", "sample_idx": 1, "values": [1.0, 1.0]}]
    pq.write_table(pa.Table.from_pylist(rows), reference)
    mine = credits([0.9, 0.1])
    assert bench.judged(SAMPLES, mine, reference, 1)["per_batch"] == [
        {"value_spearman_inner": pytest.approx(1.0), "value_spearman_within": None}]
    outcome = bench.judged(SAMPLES, mine, reference, 1, control="outcome")["per_batch"][0]
    assert outcome == {"value_spearman_inner": pytest.approx(1.0), "value_spearman_within": None}
    baseline = bench.judged(SAMPLES, mine, reference, 1, control="baseline")["per_batch"][0]
    assert baseline["value_spearman_inner"] is None


def test_command_line_writes_every_file_and_the_controls(tmp_path, capsys):
    samples, before, reference = tmp_path / "s.parquet", tmp_path / "c.parquet", tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist(SAMPLES), samples)
    pq.write_table(pa.Table.from_pylist(credits([1.0, 0.0])), before)
    pq.write_table(pa.Table.from_pylist(
        [{"prompt_id": s["prompt_id"], "sample_idx": s["sample_idx"],
          "values": [0.5, 0.5, s["reward"]] if s["prompt_id"] == "a" and s["sample_idx"] < 2 else [0.5, s["reward"]]}
         for s in SAMPLES]), reference)
    out = tmp_path / "out.json"
    bench.main([str(samples), f"before={before}", "--reference", str(reference), "--batches", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result) == {"before", "control:outcome", "control:baseline"}
    assert result["before"]["own_reward_share"] == 1.0
    assert "value ρ inner" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="NAME=PATH"):
        bench.main([str(samples), str(before)])
