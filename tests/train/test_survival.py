"""Runs that survive the cluster (issue 31): a full disk mid-run, a preemption signal, kills at any
instant. Each ends, after ``train.resume=true``, with the metrics (all but the clock columns),
held-out eval and final weights of one uninterrupted run with the same seed (``whole``, made once)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rredcot_cli.store.runs import sha256_file
from rredcot_cli.train.steptime import CLOCK_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
# Small enough for a few seconds per step on one CPU thread, with a policy gradient at every step.
TINY = [
    "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40",
    "train.steps=4", "train.prompts_per_step=2", "train.minibatch_size=2", "train.updates_per_batch=2",
    "train.lr=3e-5", "train.lr_schedule=constant", "train.warmup_steps=1", "train.eval_every=2",
    "train.eval_problems=2", "train.eval_samples=2", "train.keep_checkpoints=1",
]


def rredcot(*args, cwd, wrapper=None):
    """The CLI as a subprocess; ``wrapper``: Python that runs first in it (fault injection)."""
    command = [sys.executable, "-c", wrapper + "\nfrom rredcot_cli.cli import main; main()", *args] if wrapper \
        else [sys.executable, "-m", "rredcot_cli", *args]
    return subprocess.Popen(command, cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=600):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"rredcot failed:\n{out}\n{err}"
    return out + err


def result(run):
    """What must equal between an interrupted-and-resumed run and an uninterrupted one."""
    train = Path(run) / "train"
    return {"metrics": pq.read_table(train / "metrics.parquet").drop(list(CLOCK_COLUMNS)).to_pylist(),
            "eval": pq.read_table(train / "eval.parquet").to_pylist(),
            "weights": sha256_file(train / "checkpoints" / "final" / "model.safetensors")}


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    run = tmp_path_factory.mktemp("whole")
    finish(rredcot("train", f"run.dir={run}", *TINY, cwd=run))
    expected = result(run)
    assert [row["step"] for row in expected["metrics"]] == [1, 2, 3, 4]
    return expected


def error_line(stderr):
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# --------------------------------------------------------------------------- a full disk

# safetensors' own error on a full disk, raised when the step-2 checkpoint's weights are written.
FULL_AT_STEP_2 = textwrap.dedent("""
    import sys
    import transformers.modeling_utils as modeling_utils
    from safetensors import SafetensorError
    real = modeling_utils.safe_save_file
    def save(tensors, filename, *args, **kwargs):
        if "step-000002" in str(filename):
            open(filename, "wb").write(b"half a file")
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real(tensors, filename, *args, **kwargs)
    modeling_utils.safe_save_file = save
    sys.argv[0] = "rredcot"
""")


def _check_full_disk_then_resume(run, stderr, whole):
    line = error_line(stderr)
    checkpoints = run / "train" / "checkpoints"
    assert re.fullmatch(re.escape(f"error: cannot write {checkpoints / 'step-000002'}: No space left on device (the "
                                  "disk is full: about ") + r"[\d.]+ MB needed, [\d.]+ [kMG]?B free there; free space "
                        r"or point run.dir at another disk\); " + re.escape(
                            f"the last complete checkpoint, step 1 ({checkpoints / 'step-000001'}), is kept; free "
                            "space and rerun with train.resume=true"), line), line
    # Nothing a later stage or a resume could take as complete.
    assert not list(run.rglob("*.tmp-*")) and sorted(p.name for p in checkpoints.iterdir()) == ["step-000001"]
    assert '"status": "running"' in (run / "train" / "manifest.json").read_text()
    log = finish(rredcot("train", f"run.dir={run}", *TINY, "train.save_every=1", "train.resume=true", cwd=run))
    assert f"resuming {run / 'train'} from step 1 of 4" in " ".join(log.split())
    assert result(run) == whole


def test_a_full_disk_at_a_checkpoint_is_one_line_and_resume_continues(tmp_path, whole):
    process = rredcot("train", f"run.dir={tmp_path}", *TINY, "train.save_every=1", cwd=tmp_path,
                      wrapper=FULL_AT_STEP_2)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 2, stderr
    _check_full_disk_then_resume(tmp_path, stderr, whole)


def test_a_real_full_tmpfs_then_freed_space_resumes(tmp_path, whole):
    """The same on a real file system that fills up: a 30 MB tmpfs holds one step checkpoint of the
    embedded model (~19 MB: weights and AdamW moments) but not a second beside it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=30m", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()[:80]})")
    try:
        run = mount / "run"
        process = rredcot("train", f"run.dir={run}", *TINY, "train.save_every=1", cwd=tmp_path)
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 2, stderr
        subprocess.run(["mount", "-o", "remount,size=100m", str(mount)], check=True)  # space freed
        _check_full_disk_then_resume(run, stderr, whole)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
