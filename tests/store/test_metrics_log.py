"""metrics.parquet written by MetricsLog (a folder of parts) reads as the one file write_artifact
makes from the whole history, step after step, by ``metrics_log.read`` and by pyarrow; a step's write
does not grow with the run; a reader polling a live run sees every finished step and nothing else; a
resume takes the rows back up to the checkpoint's step (or from an older checkpoint's history), and
refuses a folder that lacks them; the single metrics.parquet files of older runs (results/) still load."""

import math
import subprocess
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rredcot_cli.errors import ArtifactError
from rredcot_cli.store import artifacts, metrics_log
from rredcot_cli.store.metrics_log import MetricsLog

REPO = Path(__file__).resolve().parents[2]


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


def _steps(path):
    return metrics_log.read(path).column("step").to_pylist()


def test_incremental_writes_equal_whole_rewrites(tmp_path):
    log = MetricsLog(tmp_path / "metrics.parquet", rows_per_part=100)
    history = []
    for step in range(1, 261):  # past the chunk merge, and over two part boundaries
        history.append(_row(step))
        log.append(history[-1])
        log.write()
        assert _steps(log.path) == list(range(1, step + 1))  # the one read function, every step
        if step in (1, 2, 99, 100, 101, 200, 255, 256, 260):
            whole = artifacts.write_artifact("train_metrics", history, tmp_path / "whole.parquet")
            assert _same(tmp_path / "metrics.parquet", whole), step  # pyarrow reads the folder as one table
    assert sorted(p.name for p in log.path.iterdir()) == ["part-000000.parquet", "part-000001.parquet",
                                                          "part-000002.parquet"]


def test_a_step_writes_as_many_bytes_at_step_10_as_late_in_the_run(tmp_path, monkeypatch):
    """What each step's write puts on disk, counted at the Parquet writer: bounded by a part (50 rows
    here), whatever the run's length. (Rewriting one file, step 210 wrote 21 times step 10's rows.)"""
    monkeypatch.setattr(metrics_log, "ROWS_PER_PART", 50, raising=False)
    written = []  # (rows, bytes) of each Parquet file written
    real_write = pq.write_table

    def counting(table, where, **kwargs):
        real_write(table, where, **kwargs)
        written.append((table.num_rows, Path(where).stat().st_size))

    monkeypatch.setattr(pq, "write_table", counting)
    log = MetricsLog(tmp_path / "metrics.parquet")
    per_step = {}
    for step in range(1, 211):
        log.append(_row(step))
        written.clear()
        log.write()
        per_step[step] = (sum(rows for rows, _ in written), sum(size for _, size in written))
    assert per_step[10][0] == per_step[210][0] == 10, (per_step[10], per_step[210])
    assert per_step[210][1] < 1.2 * per_step[10][1], (per_step[10], per_step[210])
    assert max(rows for rows, _ in per_step.values()) == 50
    assert _steps(log.path) == list(range(1, 211))


def test_a_reader_polling_a_live_run_sees_each_finished_step_and_nothing_else(tmp_path):
    """A writer that never pauses (parts of 4 rows: a part is sealed every 4 steps) and a reader:
    every read is steps 1..n, whole, in order (a temporary read as a part would repeat rows)."""
    path = tmp_path / "metrics.parquet"
    log = MetricsLog(path, rows_per_part=4)
    log.append(_row(1))
    log.write()

    def keep_writing():
        for step in range(2, 61):
            log.append(_row(step))
            log.write()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    seen = []
    try:
        while writer.is_alive():
            steps = _steps(path)
            assert steps == list(range(1, len(steps) + 1)), steps
            seen.append(len(steps))
    finally:
        writer.join()
    assert seen == sorted(seen) and len(set(seen)) > 5, seen  # it read while the run went on
    assert _steps(path) == list(range(1, 61))


@pytest.mark.parametrize("checkpoint_step", [5, 4, 2])  # in the last part, at a part's end, in an earlier part
def test_a_resume_reads_the_rows_back_up_to_the_checkpoint(tmp_path, checkpoint_step):
    path = tmp_path / "metrics.parquet"
    killed = MetricsLog(path, rows_per_part=4)
    for step in range(1, 8):  # steps after the checkpoint were written after it
        killed.append(_row(step))
        killed.write()
    resumed = MetricsLog(path, rows_per_part=4)
    resumed.restore(checkpoint_step)
    resumed.write()
    assert _steps(path) == list(range(1, checkpoint_step + 1))
    assert resumed.rows == checkpoint_step
    for step in range(checkpoint_step + 1, 10):  # made again by the resumed run, and on
        resumed.append(_row(step))
        resumed.write()
    whole = artifacts.write_artifact("train_metrics", [_row(s) for s in range(1, 10)], tmp_path / "whole.parquet")
    assert _same(path, whole)
    assert sorted(p.name for p in path.iterdir()) == [f"part-00000{i}.parquet" for i in range(3)]


def test_a_run_written_as_one_file_still_loads_and_resumes_into_parts(tmp_path):
    """Older runs hold one metrics.parquet file: read as it is; a resume of one turns it into the folder."""
    path = tmp_path / "metrics.parquet"
    artifacts.write_artifact("train_metrics", [_row(s) for s in range(1, 8)], path)
    assert _steps(path) == list(range(1, 8))
    log = MetricsLog(path, rows_per_part=4)
    log.restore(6)
    log.write()
    assert path.is_dir() and _steps(path) == list(range(1, 7))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.parquet"]  # no temporary, no old file left


def test_a_new_attempt_replaces_what_an_earlier_one_left(tmp_path):
    """A run started over (no resume) in a folder whose metrics.parquet holds more parts than it will
    have written: its first write replaces them all, so no reader sees the earlier attempt's rows."""
    path = tmp_path / "metrics.parquet"
    earlier = MetricsLog(path, rows_per_part=2)
    for step in range(1, 6):
        earlier.append(_row(step))
        earlier.write()
    again = MetricsLog(path, rows_per_part=2)
    again.append({**_row(1), "reward_mean": -1.0})
    again.write()
    assert repr(metrics_log.read(path).to_pylist()) == repr(artifacts.build_table("train_metrics", [
        {**_row(1), "reward_mean": -1.0}]).to_pylist())


def test_every_committed_run_s_metrics_still_load():
    """The metrics.parquet files committed under results/ (one file each, as runs before the parts wrote them)."""
    listed = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True, check=True)
    paths = [REPO / name for name in listed.stdout.split() if name.endswith("/metrics.parquet")]
    if not paths:
        pytest.skip("no committed run results in this checkout")
    for path in paths:
        steps = _steps(path)
        assert steps == list(range(1, len(steps) + 1)) and steps, path


def test_an_older_checkpoint_s_rows_are_taken_over_the_file(tmp_path):
    path = tmp_path / "metrics.parquet"
    artifacts.write_artifact("train_metrics", [_row(1)], path)  # not the run's: the rows come from the checkpoint
    saved_rows = [_row(step) for step in range(1, 4)]
    log = MetricsLog(path)
    log.restore(3, saved_rows)
    log.write()
    assert path.is_dir()
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
