"""One writer per stage folder: a second live process is refused in one line naming the folder and
the holder; a lock whose process died (SIGKILL) does not block the next one. The two views without a
manifest (heatmap, report) take the same lock on their output folder."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from omegaconf import OmegaConf

from rredcot_cli.errors import RunError
from rredcot_cli.store import lock
from rredcot_cli.store.runs import begin_stage
from tests.report.test_heatmap import write_inputs as write_heatmap_inputs
from tests.report.test_report import EVAL_ROWS, write_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}

# A process that begins the sample stage of a run folder, says so, and then waits (a stage at work).
HOLDER = textwrap.dedent("""
    import sys, time
    from omegaconf import OmegaConf
    from rredcot_cli.store.runs import begin_stage
    cfg = OmegaConf.create({"seed": 0, "run": {"dir": sys.argv[1], "overwrite": False, "tag": None}})
    begin_stage(cfg, "sample", [], {}, ["seed"])
    print("holding", flush=True)
    time.sleep(600)
""")


# A process that holds the writer lock of a view's output folder (another heatmap or report at work).
VIEW_HOLDER = textwrap.dedent("""
    import sys, time
    from rredcot_cli.store import lock
    lock.lock_output_folder(sys.argv[1])
    print("holding", flush=True)
    time.sleep(600)
""")


def _cfg(run_dir):
    return OmegaConf.create({"seed": 0, "run": {"dir": str(run_dir), "overwrite": False, "tag": None}})


def _start_holder(run_dir, script=HOLDER):
    holder = subprocess.Popen([sys.executable, "-c", script, str(run_dir)], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    line = holder.stdout.readline()
    assert line.strip() == "holding", holder.communicate(timeout=60)
    return holder


def test_a_second_live_process_is_refused_and_a_dead_ones_lock_does_not_block(tmp_path):
    run_dir = tmp_path / "run"
    holder = _start_holder(run_dir)
    try:
        # The real CLI, a second process on the same stage folder: one line, exit status 2.
        second = subprocess.run([sys.executable, "-m", "rredcot_cli", "sample", "experiment=quick",
                                 f"run.dir={run_dir}"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 2, second.stderr
        errors = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("error: "), second.stderr
        assert f"{run_dir / 'sample'} is being written by another rredcot process (pid {holder.pid} on " in errors[0]
        assert "wait for it to finish or stop it" in errors[0]
        assert not (run_dir / "sample" / "samples.parquet").exists()
        # The holder's folder was left alone (its manifest still says running).
        assert '"status": "running"' in (run_dir / "sample" / "manifest.json").read_text()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    # Killed: the lock file stays but the kernel dropped the lock; the next process takes it.
    assert (run_dir / "sample" / lock.LOCK_FILE).exists()
    taker = subprocess.run([sys.executable, "-c", HOLDER.replace("time.sleep(600)", ""), str(run_dir)], env=ENV,
                           capture_output=True, text=True, timeout=120)
    assert taker.returncode == 0 and taker.stdout.strip() == "holding", taker.stderr


def test_the_lock_is_per_stage_folder_and_reentrant_in_one_process(tmp_path):
    holder = _start_holder(tmp_path)
    try:
        with pytest.raises(RunError, match=r"is being written by another rredcot process \(pid \d+ on "):
            begin_stage(_cfg(tmp_path), "sample", [], {}, ["seed"])
        # Another stage folder of the same run is free; this process may begin it more than once.
        assert begin_stage(_cfg(tmp_path), "eval", [], {}, ["seed"]) is not None
        assert begin_stage(_cfg(tmp_path), "eval", [], {}, ["seed"]) is not None
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
        lock.release(tmp_path / "eval")
    assert lock.holder(tmp_path / "eval")["pid"] == os.getpid()


def _refused_in_one_line(result, folder, holder, beside):
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.output
    assert f"{folder} is being written by another rredcot process (pid {holder.pid} on " in errors[0]
    assert errors[0].endswith(f"wait for it to finish or stop it, or {beside} to write beside it"), errors[0]


def test_heatmap_and_report_are_refused_while_another_writes_their_folder(tmp_path, monkeypatch):
    from typer.testing import CliRunner  # deferred: only this test drives the CLI in-process

    from rredcot_cli.cli import app

    run = write_heatmap_inputs(tmp_path / "run", monkeypatch)
    heatmap_dir = run / "heatmap" / "grpo"
    holder = _start_holder(heatmap_dir, VIEW_HOLDER)
    try:
        result = CliRunner().invoke(app, ["heatmap", f"run.dir={run}", "method=grpo", "heatmap.samples=2",
                                          "benchmark.min_steps=3", "benchmark.max_steps=3", "benchmark.data_seed=7"])
        _refused_in_one_line(result, heatmap_dir, holder, "pass run.tag=NAME (or another run.dir)")
        assert not (heatmap_dir / "heatmap.html").exists() and not (heatmap_dir / "heatmap.png").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()

    runs = [write_run(tmp_path / f"grpo-seed{seed}", "grpo", seed, {0: 0.4, 1: 0.5}, EVAL_ROWS) for seed in (0, 1)]
    out = tmp_path / "report"
    holder = _start_holder(out, VIEW_HOLDER)
    try:
        result = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(out)])
        _refused_in_one_line(result, out, holder, "pass --out DIR")
        assert not (out / "report.md").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    # The holder gone (its lock with it), the report is written.
    result = CliRunner().invoke(app, ["report", *map(str, runs), "--out", str(out)])
    assert result.exit_code == 0 and (out / "report.md").exists(), result.output
