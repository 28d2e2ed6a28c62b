"""metrics.parquet written by MetricsLog equals the one write_artifact makes from the whole history,
step after step; a resume takes the rows back from the file up to the checkpoint's step (or from
an older checkpoint's history), and refuses a file that lacks them."""

import math

import pyarrow.parquet as pq
import pytest

from rredcot_cli.errors import ArtifactError
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
        log.append(history[-1])
        log.write()
        if step in (1, 2, 255, 256, 260):
            whole = artifacts.write_artifact("train_metrics", history, tmp_path / "whole.parquet")
            assert _same(tmp_path / "metrics.parquet", whole), step


def test_a_resume_reads_the_rows_back_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.parquet"
    killed = MetricsLog(path)
    for step in range(1, 8):  # the checkpoint is at step 5; steps 6 and 7 were written after it
        killed.append(_row(step))
        killed.write()
    resumed = MetricsLog(path)
    resumed.restore(5)
    resumed.write()
    assert resumed.table.column("step").to_pylist() == [1, 2, 3, 4, 5]
    for step in (6, 7):  # made again by the resumed run
        resumed.append(_row(step))
        resumed.write()
    whole = artifacts.write_artifact("train_metrics", [_row(s) for s in range(1, 8)], tmp_path / "whole.parquet")
    assert _same(path, whole)


def test_an_older_checkpoint_s_rows_are_taken_over_the_file(tmp_path):
    path = tmp_path / "metrics.parquet"
    artifacts.write_artifact("train_metrics", [_row(1)], path)  # not the run's: the rows come from the checkpoint
    saved_rows = [_row(step) for step in range(1, 4)]
    log = MetricsLog(path)
    log.restore(3, saved_rows)
    log.write()
    assert _same(path, artifacts.write_artifact("train_metrics", saved_rows, tmp_path / "whole.parquet"))


def test_a_file_without_the_checkpoint_s_steps_is_refused_in_one_line(tmp_path):
    path = tmp_path / "metrics.parquet"
    artifacts.write_artifact("train_metrics", [_row(1), _row(2)], path)
    with pytest.raises(ArtifactError, match=r"holds the metrics of steps 1\.\.2 \(2 rows\), but the checkpoint "
                                            r"resumed from is at step 4"):
        MetricsLog(path).restore(4)
    with pytest.raises(ArtifactError, match=r"metrics.parquet is missing, and the checkpoint resumed from \(step 1\) "
                                            "holds no metrics rows; restore the file"):
        MetricsLog(tmp_path / "missing" / "metrics.parquet").restore(1)
