"""Parquet artifacts: schema round trips, loud failures on bad files, tiling, atomic writes."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rredcot_cli.store.artifacts import ARTIFACTS, build_table, read_artifact, validate_segments_tile, write_artifact
from rredcot_cli.errors import ArtifactError
from rredcot_cli.store.runs import atomic_path, atomic_write_text
from rredcot_cli.train.steptime import PHASES

# Two rows per artifact; floats are exactly representable in float32 so round trips compare equal.
ROWS = {
    "samples": [
        dict(prompt_id="chain/test/0", sample_idx=0, prompt="3+4", prompt_token_ids=[1, 2, 3],
             completion="3+4=7\nanswer: 7", completion_token_ids=[5, 6, 7, 8], completion_logprobs=[-0.5, -1.0, -0.25, 0.0],
             reward=1.0, scorable=True, gold_answer="7", pred_answer="7", benchmark="chain",
             finish_reason="stop", num_tokens=4, meta=json.dumps({"steps": 1})),
        dict(prompt_id="chain/test/0", sample_idx=1, prompt="3+4", prompt_token_ids=[1, 2, 3],
             completion="", completion_token_ids=[], completion_logprobs=[],
             reward=0.0, scorable=False, gold_answer="7", pred_answer=None, benchmark="chain",
             finish_reason="length", num_tokens=0, meta="{}"),
    ],
    "segments": [
        dict(prompt_id="p", sample_idx=0, segment_idx=0, token_start=0, token_end=2, text="3+", strategy="newline"),
        dict(prompt_id="p", sample_idx=0, segment_idx=1, token_start=2, token_end=4, text="4=7", strategy="newline"),
    ],
    "credits": [
        dict(prompt_id="p", sample_idx=0, segment_idx=0, method="rredcot", value=0.5, credit=0.25, value_covered=False),
        dict(prompt_id="p", sample_idx=0, segment_idx=1, method="grpo", value=None, credit=-1.5, value_covered=None),
    ],
    "advantages": [
        dict(prompt_id="p", sample_idx=0, method="grpo", token_advantages=[0.5, 0.5, -0.25]),
        dict(prompt_id="p", sample_idx=1, method="grpo", token_advantages=[]),
    ],
    "eval": [
        dict(prompt_id="p", sample_idx=0, completion="x", num_tokens=1, pred_answer="7", gold_answer="7",
             correct=True, scorable=True, steps=4, benchmark="chain", model="tiny", finish_reason="stop"),
        dict(prompt_id="p", sample_idx=1, completion="y", num_tokens=1, pred_answer=None, gold_answer="7",
             correct=False, scorable=True, steps=None, benchmark="gsm8k", model="tiny", finish_reason="length"),
    ],
    "train_metrics": [
        dict(step=0, reward_mean=0.5, accuracy=0.5, loss=0.25, kl=0.0, entropy=1.5, clip_fraction=0.0,
             grad_norm=2.0, lr=0.0009765625, response_tokens_mean=12.0, tokens=2**40, seconds=1.5, eval_accuracy=None,
             sampling_rounds=None, groups_trained=None, value_loss=None, value_explained_variance=None,
             sampler_kl=None, overflow_skipped=None, **{f"seconds_{p}": None for p in PHASES},
             credit_forward_tokens=None, advantage_std=None, value_coverage=None, mismatch_logp_abs_mean=None,
             mismatch_logp_abs_max=None, mismatch_kl=None, mismatch_past_cap=None, mismatch_tokens=None),
        dict(step=1, reward_mean=0.75, accuracy=0.75, loss=-0.125, kl=0.0625, entropy=1.25, clip_fraction=0.125,
             grad_norm=1.0, lr=0.0009765625, response_tokens_mean=10.0, tokens=100, seconds=1.0, eval_accuracy=0.5,
             sampling_rounds=3, groups_trained=8, value_loss=0.125, value_explained_variance=-0.5,
             sampler_kl=0.015625, overflow_skipped=2, **{f"seconds_{p}": 0.5 for p in PHASES},
             credit_forward_tokens=2**33, advantage_std=0.5, value_coverage=0.75, mismatch_logp_abs_mean=2.5e-8,
             mismatch_logp_abs_max=3.814697265625e-06, mismatch_kl=1e-15, mismatch_past_cap=0.125,
             mismatch_tokens=2**33),
    ],
    "credit_quality": [
        dict(method="grpo", batch=0, credit_constant=True, value_spearman=None, value_pearson=None, value_spearman_inner=None,
             value_pearson_inner=None, credit_spearman=0.25, credit_pearson=0.5, value_spearman_within=None,
             credit_spearman_within=0.0, advantage_spearman=0.25, advantage_spearman_within=None,
             first_error_rate=0.0,
             first_error_chance=0.125, first_error_completions=8, advantage_std=0.0, seconds=0.5,
             seconds_vs_sample=0.25, forward_tokens=0, generated_tokens=0, backward_tokens=0, value_coverage=None,
             value_mse_inner=None),
        dict(method="mc", batch=1, credit_constant=False, value_spearman=0.75, value_pearson=0.5, value_spearman_inner=0.5,
             value_pearson_inner=0.25, credit_spearman=-0.125, credit_pearson=0.0, value_spearman_within=0.5,
             credit_spearman_within=-0.25, advantage_spearman=-0.5, advantage_spearman_within=0.125,
             first_error_rate=None,
             first_error_chance=None, first_error_completions=0, advantage_std=None, seconds=2.0,
             seconds_vs_sample=None, forward_tokens=2**40, generated_tokens=1234, backward_tokens=0,
             value_coverage=0.875, value_mse_inner=0.0625),
    ],
    "reference_values": [
        dict(prompt_id="chain/test/0", sample_idx=0, values=[0.5, 0.25, 0.0]),
        dict(prompt_id="chain/test/0", sample_idx=1, values=[0.5, 1.0]),
    ],
}


def test_every_artifact_has_example_rows():
    assert set(ROWS) == set(ARTIFACTS)


@pytest.mark.parametrize("kind", sorted(ARTIFACTS))
def test_round_trip_rows_and_columns(kind, tmp_path):
    rows = ROWS[kind]
    path = write_artifact(kind, rows, tmp_path / ARTIFACTS[kind].file_name)
    table = read_artifact(kind, path)
    assert table.schema.equals(ARTIFACTS[kind].schema)
    assert table.to_pylist() == rows
    columns = {name: [row[name] for row in rows] for name in rows[0]}
    write_artifact(kind, columns, tmp_path / "columns.parquet")
    assert read_artifact(kind, tmp_path / "columns.parquet").to_pylist() == rows


def test_numpy_columns_are_cast(tmp_path):
    columns = {
        "prompt_id": np.array(["a", "b"]),
        "sample_idx": np.array([0, 1], dtype=np.int64),
        "method": ["grpo", "grpo"],
        "token_advantages": [np.array([0.5, 1.0]), np.array([], dtype=np.float64)],
    }
    table = read_artifact("advantages", write_artifact("advantages", columns, tmp_path / "a.parquet"))
    assert table.column("token_advantages").to_pylist() == [[0.5, 1.0], []]
    assert table.schema.field("sample_idx").type == pa.int32()


def test_write_refuses_missing_extra_and_bad_columns(tmp_path):
    rows = [dict(r) for r in ROWS["credits"]]
    for row in rows:
        del row["credit"]
        row["bonus"] = 1
    with pytest.raises(ArtifactError, match="missing columns: credit; unexpected columns: bonus"):
        write_artifact("credits", rows, tmp_path / "c.parquet")
    bad = [dict(r, credit=None) for r in ROWS["credits"]]
    with pytest.raises(ArtifactError, match="column credit has 2 nulls"):
        write_artifact("credits", bad, tmp_path / "c.parquet")
    wrong = [dict(r, sample_idx="zero") for r in ROWS["credits"]]
    with pytest.raises(ArtifactError, match="column sample_idx is not int32"):
        write_artifact("credits", wrong, tmp_path / "c.parquet")
    assert not (tmp_path / "c.parquet").exists()


def test_read_missing_file_names_the_stage(tmp_path):
    with pytest.raises(ArtifactError) as info:
        read_artifact("segments", tmp_path / "segments.parquet")
    assert "segments.parquet" in str(info.value) and "rredcot segment" in str(info.value)


def test_read_corrupt_file(tmp_path):
    path = tmp_path / "samples.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ArtifactError, match="not a readable Parquet file"):
        read_artifact("samples", path)


def test_read_missing_and_mistyped_columns(tmp_path):
    table = build_table("credits", ROWS["credits"]).drop_columns(["value"])
    table = table.set_column(1, "sample_idx", pa.array([0, 0], type=pa.int64()))
    pq.write_table(table, tmp_path / "credits.parquet")
    with pytest.raises(ArtifactError) as info:
        read_artifact("credits", tmp_path / "credits.parquet")
    message = str(info.value)
    assert "missing column value" in message and "column sample_idx is int64, expected int32" in message


def test_read_allows_extra_columns(tmp_path):
    table = build_table("credits", ROWS["credits"]).append_column("note", pa.array(["a", "b"]))
    pq.write_table(table, tmp_path / "credits.parquet")
    assert read_artifact("credits", tmp_path / "credits.parquet").column("note").to_pylist() == ["a", "b"]


def _samples(lengths):
    rows = []
    for i, n in enumerate(lengths):
        row = dict(ROWS["samples"][0], sample_idx=i, completion_token_ids=list(range(n)),
                   completion_logprobs=[0.0] * n, num_tokens=n)
        rows.append(row)
    return build_table("samples", rows)


def _segments(spans):
    rows = [dict(prompt_id="chain/test/0", sample_idx=i, segment_idx=k, token_start=s, token_end=e, text="", strategy="t")
            for i, segs in spans.items() for k, (s, e) in enumerate(segs)]
    return build_table("segments", rows)


def test_tiling_accepts_exact_tilings():
    validate_segments_tile(_segments({0: [(0, 2), (2, 5)], 1: [(0, 0)]}), _samples([5, 0]))


@pytest.mark.parametrize(
    "spans, fragment",
    [
        ({0: [(1, 5)]}, "first segment starts at 1"),
        ({0: [(0, 2), (3, 5)]}, "segment 1 starts at 3 but segment 0 ends at 2"),
        ({0: [(0, 3), (2, 5)]}, "segment 1 starts at 2 but segment 0 ends at 3"),
        ({0: [(0, 4)]}, "last segment ends at 4, completion has 5 tokens"),
        ({0: [(0, 0), (0, 5)]}, "segment 0 is empty"),
        ({}, "no segments"),
        ({0: [(0, 5)], 7: [(0, 1)]}, "not in samples"),
    ],
)
def test_tiling_rejects_gaps_overlaps_and_short_ends(spans, fragment):
    with pytest.raises(ArtifactError, match="segments do not tile") as info:
        validate_segments_tile(_segments(spans) if spans else build_table("segments", []), _samples([5]))
    assert fragment in str(info.value)


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    path = tmp_path / "samples.parquet"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("writer crashed")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.parquet"]


def test_atomic_path_replaces_files_and_folders(tmp_path):
    path = tmp_path / "out.txt"
    with atomic_path(path) as tmp:
        assert tmp.parent == tmp_path and not tmp.exists()
        tmp.write_text("new")
    assert path.read_text() == "new"

    folder = tmp_path / "checkpoint"
    for version in ["v1", "v2"]:
        with atomic_path(folder) as tmp:
            tmp.mkdir()
            (tmp / "weights.bin").write_text(version)
    assert (folder / "weights.bin").read_text() == "v2"
    with pytest.raises(RuntimeError):
        with atomic_path(folder) as tmp:
            tmp.mkdir()
            (tmp / "weights.bin").write_text("half")
            raise RuntimeError("save_pretrained crashed")
    assert (folder / "weights.bin").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "out.txt"]


def test_failed_write_artifact_keeps_the_old_file(tmp_path, monkeypatch):
    path = write_artifact("credits", ROWS["credits"], tmp_path / "credits.parquet")

    def crash(table, where, **kwargs):
        open(where, "wb").write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(OSError):
        write_artifact("credits", ROWS["credits"][:1], path)
    monkeypatch.undo()
    assert read_artifact("credits", path).num_rows == 2
    assert [p.name for p in tmp_path.iterdir()] == ["credits.parquet"]
