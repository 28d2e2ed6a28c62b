"""Reruns and interrupts of `rredcot train` (issue 38, items 1, 2 and 9a): rerunning the same command
after a kill continues the attempt and says so; other options are refused with the ways on; Ctrl-C
finishes the step with a checkpoint (a second one stops at once); a signal during start-up or the
final weights and eval stops at once, its manifest saying so, and the same command continues.

The signals are sent by the process to itself at a chosen point (a wrapper patches the stage), so
each test hits the phase it names every time."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
TINY = [
    "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=24",
    "train.steps=3", "train.prompts_per_step=2", "train.minibatch_size=4", "train.updates_per_batch=1",
    "train.lr=3e-5", "train.lr_schedule=constant", "train.warmup_steps=1", "train.eval_every=0",
    "train.eval_problems=2", "train.eval_samples=1", "train.save_every=1",
]


def rredcot(run, *args, wrapper=None):
    """``rredcot train run.dir=RUN *TINY *args``; ``wrapper``: Python run first (the signal's timing)."""
    prelude = [sys.executable, "-c", textwrap.dedent(wrapper) + "\nfrom rredcot_cli.cli import main; main()"] \
        if wrapper else [sys.executable, "-m", "rredcot_cli"]
    done = subprocess.run([*prelude, "train", f"run.dir={run}", *TINY, *args], cwd=run.parent, env=ENV,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, flat(done.stderr)


def flat(text):
    """``text`` without white space: rich wraps long lines at 80 columns, inside paths too."""
    return "".join(text.split())


def manifest(run):
    return json.loads((run / "train" / "manifest.json").read_text())


def steps(run):
    return [row["step"] for row in pq.read_table(run / "train" / "metrics.parquet").to_pylist()]


def checkpoints(run):
    return sorted(p.name for p in (run / "train" / "checkpoints").iterdir())


# Patches Trainer.update to send the process SIGNAL (COUNT times) in step 2's update.
SIGNAL_IN_STEP_2 = """
    import os, signal, sys
    from rredcot_cli.train import loop
    real = loop.Trainer.update
    def update(self, batch, credit):
        if self.state.step == 1:  # step 2 is running
            for _ in range(COUNT):
                os.kill(os.getpid(), signal.SIGNAL)
        return real(self, batch, credit)
    loop.Trainer.update = update
    sys.argv[0] = "rredcot"
"""


def test_a_rerun_of_a_killed_run_continues_it_and_says_so(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # Killed (as by SIGKILL) in step 2's update, after the step-1 checkpoint.
    code, _ = rredcot(run, wrapper=SIGNAL_IN_STEP_2.replace("COUNT", "1").replace("SIGNAL", "SIGKILL"))
    assert code == -9 and manifest(run)["status"] == "running" and checkpoints(run) == ["step-000001"]

    # Other options: refused in one line, the attempt and its checkpoint kept.
    code, err = rredcot(run, "train.lr=1e-4")
    assert code == 2 and err == flat(
        f"error: {run / 'train'} holds an unfinished train attempt (status 'running') made with other options "
        "(differs in: train); rerun with its options to continue it, pass run.tag=NAME to keep it and run beside "
        "it, or run.overwrite=true to replace it")
    assert checkpoints(run) == ["step-000001"]

    # The same command continues from step 1, saying so in one line.
    code, err = rredcot(run)
    assert code == 0, err
    assert flat(f"found an unfinished attempt (status 'running'): resuming {run / 'train'} from step 1 of 3 "
                f"({run / 'train' / 'checkpoints' / 'step-000001'}); pass train.resume=false to start over, or "
                "run.tag=NAME to run beside it") in err
    assert flat("held-out pass@1 before training") not in err
    assert manifest(run)["status"] == "complete" and manifest(run)["extra"]["resumed_from_step"] == 1
    assert steps(run) == [1, 2, 3]


def test_ctrl_c_finishes_the_step_checkpoints_and_the_same_command_continues(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    code, err = rredcot(run, "train.save_every=0",
                        wrapper=SIGNAL_IN_STEP_2.replace("COUNT", "1").replace("SIGNAL", "SIGINT"))
    assert code == 130, err
    assert flat("Ctrl-C: finishing step 2 and saving a checkpoint; press Ctrl-C again to stop at once") in err
    checkpoint = run / "train" / "checkpoints" / "step-000002"
    assert err.endswith(flat(f"interrupted by SIGINT: stopped after step 2 of 3 and saved {checkpoint}; continue "
                             "with the same command plus train.resume=true (exit status 130)")), err
    assert "Traceback" not in err
    stopped = manifest(run)
    assert stopped["status"] == "interrupted" and stopped["interrupted"]["step"] == 2
    assert steps(run) == [1, 2] and checkpoints(run) == ["step-000002"]

    code, err = rredcot(run, "train.save_every=0")
    assert code == 0, err
    assert flat(f"found an unfinished attempt (status 'interrupted'): resuming {run / 'train'} from step 2 of 3") in err
    assert manifest(run)["status"] == "complete" and steps(run) == [1, 2, 3]


def test_a_second_ctrl_c_stops_at_once_and_the_manifest_says_interrupted(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    code, err = rredcot(run, wrapper=SIGNAL_IN_STEP_2.replace("COUNT", "2").replace("SIGNAL", "SIGINT"))
    assert code == 130, err
    assert err.endswith(flat(f"interrupted by SIGINT: stopped at once; rerun the same command to continue from "
                             f"step 1 ({run / 'train' / 'checkpoints' / 'step-000001'}) (exit status 130)")), err
    assert "Traceback" not in err
    stopped = manifest(run)
    assert stopped["status"] == "interrupted" and stopped["interrupted"] == {**stopped["interrupted"], "step": 1,
                                                                            "signal": "SIGINT"}
    assert steps(run) == [1] and checkpoints(run) == ["step-000001"]


def test_a_signal_during_start_up_stops_at_once_with_a_marked_manifest(tmp_path):
    """SIGTERM while the model loads: exit 75, one line, the manifest "preempted" (not "running");
    the same command then runs the attempt from step 0."""
    run = tmp_path / "run"
    run.mkdir()
    code, err = rredcot(run, wrapper="""
        import os, signal, sys
        from rredcot_cli.stages import train
        real = train.make_policy
        def make_policy(cfg):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(cfg)
        train.make_policy = make_policy
        sys.argv[0] = "rredcot"
    """)
    assert code == 75, err
    assert err == flat("preempted by SIGTERM: stopped at once; no step checkpoint was written yet: rerun the same "
                       "command to start again (exit status 75)")
    stopped = manifest(run)
    assert stopped["status"] == "preempted" and stopped["preempted"]["step"] == 0

    code, err = rredcot(run)
    assert code == 0, err
    assert flat(f"found an unfinished attempt in {run / 'train'} with no checkpoint yet (train.save_every=1): "
                "starting from step 0") in err
    assert manifest(run)["status"] == "complete" and steps(run) == [1, 2, 3]


def test_a_signal_while_the_final_weights_are_written_checkpoints_the_last_step(tmp_path):
    """SIGTERM as checkpoints/final is written: it stops at once, the last step is checkpointed and
    the manifest says "preempted"; the same command redoes only the final weights and eval."""
    run = tmp_path / "run"
    run.mkdir()
    code, err = rredcot(run, wrapper="""
        import os, signal, sys
        from rredcot_cli.train import loop
        real = loop._save_checkpoint
        def save(*args):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(*args)
        loop._save_checkpoint = save
        sys.argv[0] = "rredcot"
    """)
    assert code == 75, err
    last = run / "train" / "checkpoints" / "step-000003"
    assert err.endswith(flat(f"preempted by SIGTERM: stopped after step 3 of 3 and saved {last}; continue with the "
                             "same command plus train.resume=true (exit status 75)")), err
    assert manifest(run)["status"] == "preempted" and manifest(run)["preempted"]["step"] == 3
    assert "final" not in checkpoints(run) and not list(run.rglob("*.tmp-*"))

    code, err = rredcot(run)
    assert code == 0, err
    assert flat("from step 3 of 3") in err
    assert manifest(run)["status"] == "complete" and steps(run) == [1, 2, 3]
    assert (run / "train" / "checkpoints" / "final" / "model.safetensors").is_file()


# Patches the sample stage to send the process SIGNAL while it samples.
SAMPLE_WITH_SIGNAL = """
    import os, signal, sys
    # Python's own Ctrl-C handler, as a start from a terminal gives it: a job started with `&` from a
    # script inherits SIGINT ignored, and Python then keeps ignoring it (the suite run that way failed)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from rredcot_cli.stages import sample
    real = sample.sample_rows
    def sample_rows(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGNAL)
        return real(*args, **kwargs)
    sample.sample_rows = sample_rows
    sys.argv[0] = "rredcot"
"""


def test_ctrl_c_in_another_stage_says_so_and_marks_its_manifest(tmp_path):
    """The other stages take Ctrl-C as Python does (at once), but say so in one line and leave no
    manifest at "running": a fresh folder holding nothing is removed, a rerun's is marked."""
    def sample(run, signal_name):
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SAMPLE_WITH_SIGNAL.replace("SIGNAL", signal_name))
                               + "\nfrom rredcot_cli.cli import main; main()", "sample", f"run.dir={run}",
                               "sample.num_prompts=2", "sampling.n=2", "sampling.max_new_tokens=8"],
                              cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
        return done.returncode, flat(done.stderr)

    code, err = sample(tmp_path / "fresh", "SIGINT")
    assert code == 130 and err.endswith(flat("interrupted by SIGINT: stopped at once; no stage output had been "
                                             "written (exit status 130)")), err
    assert not (tmp_path / "fresh").exists()

    run = tmp_path / "run"
    code, _ = sample(run, "SIGKILL")  # an attempt killed outright: its manifest stays "running"
    assert code == -9 and json.loads((run / "sample" / "manifest.json").read_text())["status"] == "running"
    code, err = sample(run, "SIGINT")
    assert code == 130, err
    assert err.startswith(flat(f"{run / 'sample'}: found an unfinished sample attempt with the same config "
                               "(status 'running'); starting it over")), err
    assert err.endswith(flat(f"interrupted by SIGINT: stopped at once; {run / 'sample'} marked interrupted; rerun the "
                             "same command to run it again (exit status 130)")), err
    stopped = json.loads((run / "sample" / "manifest.json").read_text())
    assert stopped["status"] == "interrupted" and stopped["interrupted"]["signal"] == "SIGINT"
