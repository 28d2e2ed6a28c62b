"""metrics.parquet written by MetricsLog equals the one write_artifact makes from the whole history,
step after step, also when the history is replaced by a restored one (a resume)."""

import math

import pyarrow.parquet as pq

from rredcot_cli.store import artifacts
from rredcot_cli.store.metrics_log import MetricsLog


def _row(step):
    spec = artifacts.get_spec("train_metrics")
    row = {f.name: None for f in spec.schema}
    row.update(step=step, reward_mean=step / 10, accuracy=0.5, loss=math.nan if step == 3 else -step / 7,
               kl=0.0, entropy=1.5, clip_fraction=0.0, grad_norm=float(step), response_tokens_mean=9.0,
               lr=1e-5, tokens=step * 11, seconds=0.1 * step)
    return {k: v for k, v in row.items() if v is not None or spec.schema.field(k).nullable}


def _same(a, b):
    """Same schema (and its metadata) and the same values, NaN equal to NaN."""
    a, b = pq.read_table(a), pq.read_table(b)
    return a.schema.equals(b.schema, check_metadata=True) and repr(a.to_pylist()) == repr(b.to_pylist())


def test_incremental_writes_equal_whole_rewrites(tmp_path):
    log = MetricsLog(tmp_path / "metrics.parquet")
    history = []
    for step in range(1, 261):  # past the chunk merge
        history.append(_row(step))
        log.write(history)
        if step in (1, 2, 255, 256, 260):
            whole = artifacts.write_artifact("train_metrics", history, tmp_path / "whole.parquet")
            assert _same(tmp_path / "metrics.parquet", whole), step
    # A resume restores an earlier history: what is written is that history, then it grows again.
    restored = [_row(step) for step in range(1, 101)]
    restored[-1]["accuracy"] = 0.25
    log.write(restored)
    restored.append(_row(101))
    log.write(restored)
    whole = artifacts.write_artifact("train_metrics", restored, tmp_path / "whole.parquet")
    assert _same(tmp_path / "metrics.parquet", whole)
    assert artifacts.read_artifact("train_metrics", tmp_path / "metrics.parquet").num_rows == 101
