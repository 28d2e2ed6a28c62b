"""Atomic writes: a process killed (SIGKILL) in the middle of writing an artifact or a checkpoint
leaves the previous complete version in place, and nothing a later stage reads is partial."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rredcot_cli.store import runs
from rredcot_cli.store.artifacts import read_artifact, write_artifact
from rredcot_cli.store.runs import atomic_path, find_input, remove_stale_temporaries

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROW = {
    "prompt_id": "p0", "sample_idx": 0, "prompt": "1+1", "prompt_token_ids": [1, 2], "completion": "=2",
    "completion_token_ids": [3, 4], "completion_logprobs": [-0.1, -0.2], "reward": 1.0, "scorable": True,
    "gold_answer": "2", "pred_answer": "2", "benchmark": "chain", "finish_reason": "stop", "num_tokens": 2,
    "meta": "{}",
}

# A child that writes new samples over the old ones but stops (as if the disk were slow) after
# half of the Parquet bytes are on disk, says so, and waits to be killed.
_HALF_WRITER = textwrap.dedent("""
    import sys, time
    import pyarrow.parquet as pq
    from rredcot_cli.store.artifacts import write_artifact

    def half_then_hang(table, where, **kwargs):
        import io
        buffer = io.BytesIO()
        real_write(table, buffer)
        with open(where, "wb") as f:
            f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            f.flush()
        print("half written", flush=True)
        time.sleep(120)

    real_write, pq.write_table = pq.write_table, half_then_hang
    row = dict(%r)
    write_artifact("samples", [dict(row, sample_idx=i) for i in range(5)], sys.argv[1])
""")


def _kill_mid_write(script, *args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "half written", child.stderr.read()
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    assert child.returncode == -signal.SIGKILL


def test_artifact_killed_mid_write_keeps_the_old_file(tmp_path):
    run = tmp_path / "run"
    path = write_artifact("samples", [ROW], run / "sample" / "samples.parquet")
    before = path.read_bytes()

    _kill_mid_write(_HALF_WRITER % (ROW,), path)

    assert path.read_bytes() == before
    leftovers = [p.name for p in path.parent.iterdir() if p.name != "samples.parquet"]
    assert len(leftovers) == 1 and leftovers[0].startswith("samples.parquet.tmp-")  # the half file
    cfg = _cfg(run)
    assert find_input(cfg, "samples") == path  # readers never see the temporary
    assert read_artifact("samples", find_input(cfg, "samples")).num_rows == 1
    # The next stage start in that folder clears the leftover.
    assert [p.name for p in remove_stale_temporaries(path.parent)] == leftovers
    assert [p.name for p in path.parent.iterdir()] == ["samples.parquet"]


def test_first_write_killed_leaves_no_artifact(tmp_path):
    path = tmp_path / "sample" / "samples.parquet"
    _kill_mid_write(_HALF_WRITER % (ROW,), path)
    assert not path.exists()
    with pytest.raises(Exception, match="no samples.parquet"):
        find_input(_cfg(tmp_path), "samples")


def test_checkpoint_folder_killed_between_its_renames_is_recovered(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints" / "final"
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        (tmp / "model.safetensors").write_bytes(b"v1")

    real_replace, calls = os.replace, []

    def replace_then_die(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # old moved aside, new not yet in place
            raise KeyboardInterrupt("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(folder) as tmp:
            tmp.mkdir()
            (tmp / "model.safetensors").write_bytes(b"v2")
    monkeypatch.undo()
    assert not folder.exists()  # the window atomic_path cannot close with two renames
    remove_stale_temporaries(tmp_path)
    assert (folder / "model.safetensors").read_bytes() == b"v1"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["final"]


def test_every_writer_fails_without_touching_the_old_output(tmp_path, monkeypatch):
    """Each helper the stages write through leaves the old file when the write fails midway."""
    text = runs.atomic_write_text(tmp_path / "summary.json", "{}")
    real_open = open

    def open_then_fail(path, mode="r", *args, **kwargs):
        handle = real_open(path, mode, *args, **kwargs)
        if "w" in mode and ".tmp-" in str(path):
            handle.write(b"{\"half")
            handle.close()
            raise OSError(28, "No space left on device")
        return handle

    monkeypatch.setattr("builtins.open", open_then_fail)
    with pytest.raises(OSError, match=f"cannot write {text}: No space left on device"):
        runs.atomic_write_text(text, '{"new": true}')
    monkeypatch.undo()
    assert text.read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def _cfg(run_dir):
    from omegaconf import OmegaConf

    return OmegaConf.create({"run": {"dir": str(run_dir), "tag": None}, "method": {"name": "grpo"},
                             "inputs": {"samples": None}})


def test_a_reader_never_sees_a_torn_file_while_a_writer_replaces_it(tmp_path):
    """Train rewrites metrics.parquet after every step while users and tests poll it. pyarrow
    opens a path more than once per read (footer, then pages), so reading by path across an
    atomic replace mixed two versions (CI saw "Page was smaller than expected"); read_artifact
    reads through one open handle. Hundreds of reads against a writer that never pauses: the old
    reader failed most of them."""
    import threading

    path = tmp_path / "samples.parquet"
    write_artifact("samples", [ROW], path)
    done = threading.Event()

    def keep_replacing():
        n = 1
        while not done.is_set():
            n = n % 40 + 1
            write_artifact("samples", [{**ROW, "sample_idx": i} for i in range(n)], path)

    writer = threading.Thread(target=keep_replacing)
    writer.start()
    try:
        counts = [read_artifact("samples", path).num_rows for _ in range(300)]
    finally:
        done.set()
        writer.join()
    assert set(counts) - {1} and all(1 <= n <= 40 for n in counts)  # it read while the file changed
