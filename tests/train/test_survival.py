"""Runs that survive the cluster (issue 31): a full disk mid-run, a preemption signal, kills at any
instant. Each ends, after ``train.resume=true``, with the metrics (all but the clock columns),
held-out eval and final weights of one uninterrupted run with the same seed (``whole``, made once)."""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from processes import children, fake_slurm_tools, free_port

from rredcot_cli.errors import PREEMPTED_EXIT
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
def whole_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("whole")
    finish(rredcot("train", f"run.dir={run}", *TINY, cwd=run))
    return run


@pytest.fixture(scope="module")
def whole(whole_run):
    expected = result(whole_run)
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


# --------------------------------------------------------------------------- preemption signals


def _wait_for(path, process, timeout=600):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the run ended first: {process.communicate()}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.01)


def test_a_preemption_signal_finishes_the_step_checkpoints_and_resumes_to_the_same_run(tmp_path, whole):
    """SIGUSR1 at a random moment of step 2 (seeded): the step finishes, checkpoints/step-2 is written
    (a second signal, SIGTERM, while it is written changes nothing), one line, exit status 75; the
    resumed run equals the uninterrupted one. No periodic checkpoint is due (train.save_every=10)."""
    process = rredcot("train", f"run.dir={tmp_path}", *TINY, cwd=tmp_path)
    _wait_for(tmp_path / "train" / "metrics.parquet", process)  # step 1 finished: step 2 is running
    time.sleep(random.Random(31).uniform(0, 1.0))
    process.send_signal(signal.SIGUSR1)
    checkpoints = tmp_path / "train" / "checkpoints"
    while process.poll() is None and not list(checkpoints.glob("step-*")):
        time.sleep(0.005)
    if process.poll() is None:  # the checkpoint is being written (or was just renamed into place)
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=600)
    assert process.returncode == PREEMPTED_EXIT, err
    stopped = len(pq.read_table(tmp_path / "train" / "metrics.parquet"))
    assert 1 <= stopped < 4  # the step the signal came in (or whose end it met) finished; the run stopped there
    lines = [line for line in err.splitlines() if line.startswith("preempted by")]
    assert lines == [f"preempted by SIGUSR1: stopped after step {stopped} of 4 and saved "
                     f"{checkpoints / f'step-{stopped:06d}'}; continue with the same command plus train.resume=true "
                     "(exit status 75)"], err
    assert "Traceback" not in err and "error:" not in err
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step-{stopped:06d}"]
    manifest = json.loads((tmp_path / "train" / "manifest.json").read_text())
    assert manifest["status"] == "preempted" and manifest["preempted"]["step"] == stopped
    assert manifest["preempted"]["signal"] == "SIGUSR1"
    log = finish(rredcot("train", f"run.dir={tmp_path}", *TINY, "train.resume=true", cwd=tmp_path))
    assert f"from step {stopped} of 4" in " ".join(log.split())
    assert result(tmp_path) == whole


def test_an_unknown_preemption_signal_is_refused_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from rredcot_cli.cli import app

    done = CliRunner().invoke(app, ["train", f"run.dir={tmp_path / 'run'}", "experiment=quick",
                                    "train.preempt_signals=[SIGFOO]"])
    assert done.exit_code == 2
    assert error_line(done.stderr) == ("error: train.preempt_signals: unknown signal 'SIGFOO'; use names such as SIGTERM, "
                               "SIGUSR1, SIGUSR2, SIGINT")
    assert not (tmp_path / "run").exists()


def _rank_of(pid):
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((int(e.split(b"=", 1)[1]) for e in environ if e.startswith(b"RANK=")), None)


def test_the_slurm_script_requeues_a_signalled_torchrun_job_that_resumes(tmp_path):
    """scripts/slurm/train.sbatch with stand-ins for srun and scontrol, one node, two ranks (gloo):
    SIGUSR1 to the batch shell (Slurm's --signal=B:USR1@120) reaches both ranks, which stop after the
    same step with one checkpoint; the script requeues the job; the requeued job resumes and finishes.
    Then a signal to one rank only: the other rank stops after the same step too (the flag is
    all-reduced at each step boundary)."""
    bin_dir = tmp_path / "bin"
    requeued = tmp_path / "requeued"
    fake_slurm_tools(bin_dir, scontrol=f'#!/bin/bash\nif [[ $1 == requeue ]]; then echo "$@" >> {requeued}; '
                                       'else echo localhost; fi\n')
    port = free_port()
    run = tmp_path / "run"
    env = {**ENV, "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
           "RUN_DIR": str(run), "GPUS_PER_NODE": "2", "RDZV_PORT": str(port), "SLURM_JOB_NODELIST": "node1",
           "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242"}
    settings = [*TINY, "train.parallel=ddp", "backend.batch_size=4", "train.dist_timeout_s=120"]

    def sbatch():
        return subprocess.Popen(["bash", str(Path(REPO) / "scripts" / "slurm" / "train.sbatch"), *settings],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    job = sbatch()
    _wait_for(run / "train" / "metrics.parquet", job)
    job.send_signal(signal.SIGUSR1)
    out, err = job.communicate(timeout=600)
    assert job.returncode == 0, out[-3000:] + err[-3000:]
    assert requeued.read_text() == "requeue 4242\n"
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    stopped = manifest["preempted"]["step"]
    assert manifest["status"] == "preempted" and 1 <= stopped < 4
    assert sorted(p.name for p in (run / "train" / "checkpoints").iterdir()) == [f"step-{stopped:06d}"]
    assert err.count("preempted by SIGTERM") == 1, err  # rank 0 says it, once

    out, err = sbatch().communicate(timeout=600)  # the requeued job
    assert f"from step {stopped} of 4" in " ".join(err.split()), err[-3000:]
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and requeued.read_text() == "requeue 4242\n"
    assert [row["step"] for row in pq.read_table(run / "train" / "metrics.parquet").to_pylist()] == [1, 2, 3, 4]

    # One rank signalled: both stop after the same step (torchrun itself gets nothing).
    other = tmp_path / "other"
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                                 "-m", "rredcot_cli", "train", f"run.dir={other}", *settings], cwd=tmp_path, env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(other / "train" / "metrics.parquet", launcher)
    workers = {_rank_of(pid): pid for pid in children(launcher.pid)}
    os.kill(workers[1], signal.SIGUSR1)
    out, err = launcher.communicate(timeout=600)
    assert launcher.returncode != 0 and "exitcode  : 75" in err.replace("exitcode: ", "exitcode  : "), err[-3000:]
    manifest = json.loads((other / "train" / "manifest.json").read_text())
    assert manifest["status"] == "preempted" and manifest["preempted"]["signal"] == "a signal on another rank"
    stopped = manifest["preempted"]["step"]
    assert len(pq.read_table(other / "train" / "metrics.parquet")) == stopped
    assert (other / "train" / "checkpoints" / f"step-{stopped:06d}" / "trainer_state.pt").is_file()


# --------------------------------------------------------------------------- kills at any instant


def test_three_kills_at_drawn_moments_resume_to_the_same_run(tmp_path, whole_run):
    """bench/kill_anywhere.py with 3 SIGKILLs (the bench's 20-kill run: results/kill-anywhere/),
    compared with the uninterrupted run of these settings."""
    done = subprocess.run([sys.executable, str(Path(REPO) / "bench" / "kill_anywhere.py"), "--kills", "3", "--seed", "1",
                           "--out", str(tmp_path), "--work", str(tmp_path / "work"), "--reference", str(whole_run),
                           "--", *TINY], env=ENV, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "kills-3-seed1.json").read_text())
    assert report["kills"] == 3 and report["identical"] is True
    assert all(r["leftover_temporaries"] == [] for r in report["rounds"])


# --------------------------------------------------------------------------- checkpoints of earlier versions

# The writer before metrics.parquet was the rows' only home: progress["history"] holds the rows so far
# (as those versions kept them: without the per-phase clock columns of older rows still), then the
# run dies right after the step-2 checkpoint.
OLD_CHECKPOINT_THEN_DIE = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from rredcot_cli.store import artifacts
    from rredcot_cli.train import checkpoint
    real_save = checkpoint.save
    def save(path, state, parts, config_hash):
        rows = artifacts.read_artifact("train_metrics", Path(path).parents[1] / "metrics.parquet").to_pylist()
        history = [{k: v for k, v in row.items() if not k.startswith("seconds_")} for row in rows]
        progress = state.progress
        state.progress = lambda: {**progress(), "history": history}
        real_save(path, state, parts, config_hash)
        os._exit(9)
    checkpoint.save = save
    sys.argv[0] = "rredcot"
""")


def test_a_checkpoint_that_carries_the_metrics_history_still_resumes(tmp_path, whole):
    """Checkpoints written before the metrics rows left them carry the rows (``progress["history"]``):
    a resume takes them from there, not from metrics.parquet (deleted here), and ends as the
    uninterrupted run."""
    process = rredcot("train", f"run.dir={tmp_path}", *TINY, "train.save_every=2", cwd=tmp_path,
                      wrapper=OLD_CHECKPOINT_THEN_DIE)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 9, err[-3000:]
    shutil.rmtree(tmp_path / "train" / "metrics.parquet")  # the folder of parts
    log = finish(rredcot("train", f"run.dir={tmp_path}", *TINY, "train.save_every=2", "train.resume=true", cwd=tmp_path))
    assert "from step 2 of 4" in " ".join(log.split())
    assert result(tmp_path) == whole
