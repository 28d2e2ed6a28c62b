"""Resume: a CPU training run killed with SIGKILL and resumed with train.resume=true ends with the
same metrics, held-out eval and final weights as an uninterrupted run with the same seed, also
when train.keep_checkpoints deleted the older step checkpoints; plus the pieces resuming relies on
(which checkpoint is picked, refusing other options)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from rredcot_cli.errors import RunError
from rredcot_cli.store.runs import begin_stage, remove_stale_temporaries, sha256_file
from rredcot_cli.train import checkpoint
from rredcot_cli.stages import train
from rredcot_cli.train.steptime import CLOCK_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Small enough for seconds per step on one CPU thread, with a non-zero policy gradient at every
# step (so weights, optimizer moments and the minibatch order all shape the later steps).
TINY = [
    "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40",
    "train.steps=6", "train.save_every=2", "train.prompts_per_step=2", "train.minibatch_size=2",
    "train.updates_per_batch=2", "train.lr=3e-5", "train.lr_schedule=constant", "train.warmup_steps=1",
    "train.eval_every=3", "train.eval_problems=2", "train.eval_samples=2",
]


def rredcot(*args, cwd):
    """The CLI as a subprocess (a fresh interpreter, as a real restart would be)."""
    return subprocess.Popen([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}


def finish(process, timeout=300):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"rredcot failed:\n{out}\n{err}"
    return out + err


def metrics_without_clock(run):
    return pq.read_table(run / "train" / "metrics.parquet").drop(list(CLOCK_COLUMNS)).to_pylist()


def test_killed_run_resumes_to_the_same_result(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    finish(rredcot("train", f"run.dir={whole}", *TINY, cwd=tmp_path))

    # keep_checkpoints=1: each step checkpoint deletes the one before (not part of the run's identity)
    process = rredcot("train", f"run.dir={killed}", *TINY, "train.keep_checkpoints=1", cwd=tmp_path)
    first_state = killed / "train" / "checkpoints" / "step-000002"  # appears complete (atomic rename)
    deadline = time.monotonic() + 300
    while not first_state.exists():
        assert process.poll() is None, f"the run ended before its first checkpoint: {process.communicate()}"
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    # Killed mid-run: nothing final was written and the manifest says so; metrics.parquet holds
    # the steps that finished.
    assert json.loads((killed / "train" / "manifest.json").read_text())["status"] == "running"
    assert metrics_without_clock(killed)[:2] == metrics_without_clock(whole)[:2]
    assert not (killed / "train" / "checkpoints" / "final").exists()

    log = finish(rredcot("train", f"run.dir={killed}", *TINY, "train.resume=true", "train.keep_checkpoints=1",
                         cwd=tmp_path))
    resumed_from = int(re.search(r"from step (\d+) of 6", " ".join(log.split())).group(1))
    assert 2 <= resumed_from < 6

    # Remaining steps (and the restored earlier ones) equal the uninterrupted run's.
    expected = metrics_without_clock(whole)
    assert [row["step"] for row in expected] == [1, 2, 3, 4, 5, 6]
    assert all(row["grad_norm"] > 0 for row in expected)  # every step really updated the policy
    assert metrics_without_clock(killed) == expected
    assert pq.read_table(killed / "train" / "eval.parquet").equals(pq.read_table(whole / "train" / "eval.parquet"))
    final = "train/checkpoints/final/model.safetensors"
    assert sha256_file(killed / final) == sha256_file(whole / final)
    summary = {run: json.loads((run / "train" / "summary.json").read_text()) for run in (whole, killed)}
    assert summary[killed]["eval_after"] == summary[whole]["eval_after"]
    # CPU time adds up over the two attempts as wall time does (both positive, neither reset).
    for run in (whole, killed):
        assert 0 < summary[run]["cpu_seconds"] and 0 < summary[run]["seconds"]
    manifest = json.loads((killed / "train" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and len(manifest["resumed"]) == 1
    assert manifest["extra"]["resumed_from_step"] == resumed_from
    assert sorted(p.name for p in (killed / "train" / "checkpoints").iterdir()) == ["final", "step-000004"]
    # A checkpoint holds no metrics rows (metrics.parquet does: a resume reads them back from it).
    progress = torch.load(killed / "train" / "checkpoints" / "step-000004" / checkpoint.STATE_FILE,
                          weights_only=True)["progress"]
    assert progress["step"] == 4 and "history" not in progress
    # The resumed run has the same identity: rerunning without resume=true skips it.
    log = finish(rredcot("train", f"run.dir={killed}", *TINY, cwd=tmp_path))
    assert "up to date" in log
    assert not list(killed.rglob("*.tmp-*"))


def _cfg(run_dir, **changes):
    cfg = OmegaConf.create({"seed": 0, "run": {"dir": str(run_dir), "overwrite": False, "tag": None},
                            "train": {"lr": 1e-3, "steps": 4}})
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value)
    return cfg


def test_resume_refuses_an_attempt_made_with_other_options(tmp_path):
    begin_stage(_cfg(tmp_path), "train", [], {}, ["seed", "train"])  # started, never finished
    with pytest.raises(RunError) as info:
        begin_stage(_cfg(tmp_path, train__lr=1e-4), "train", [], {}, ["seed", "train"], resume=True)
    message = str(info.value)
    assert message == (
        f"cannot resume {tmp_path / 'train'}: its unfinished train attempt was made with other options "
        "(differs in: train); resume with the same options, or pass run.overwrite=true to start over"
    )
    # The same options continue the attempt; without resume another config is refused too (its
    # checkpoints are kept), unless run.overwrite=true replaces it.
    assert begin_stage(_cfg(tmp_path), "train", [], {}, ["seed", "train"], resume=True).continuing
    with pytest.raises(RunError, match="run.overwrite=true to replace it"):
        begin_stage(_cfg(tmp_path, train__lr=1e-4), "train", [], {}, ["seed", "train"])
    assert not begin_stage(_cfg(tmp_path, train__lr=1e-4, run__overwrite=True), "train", [], {},
                           ["seed", "train"]).continuing


def test_resume_and_the_divergence_limit_do_not_change_the_run_identity():
    from rredcot_cli.config.compose import compose
    from rredcot_cli.store.hashing import config_hash

    plain = train._hashed_config(compose([]))
    resumed = train._hashed_config(compose(["train.resume=true", "train.max_nonfinite_updates=9"]))
    assert config_hash(plain, train.CONFIG_KEYS) == config_hash(resumed, train.CONFIG_KEYS)
    other = train._hashed_config(compose(["train.lr=1e-4"]))
    assert config_hash(plain, train.CONFIG_KEYS) != config_hash(other, train.CONFIG_KEYS)


def _fake_state(folder, config_hash, step):
    folder.mkdir(parents=True)
    torch.save({checkpoint.KEY_FORMAT: checkpoint.STATE_FORMAT, checkpoint.KEY_CONFIG_HASH: config_hash,
                checkpoint.KEY_PROGRESS: {"step": step}}, folder / checkpoint.STATE_FILE)


def test_latest_state_is_the_highest_complete_one_of_this_config(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    _fake_state(checkpoints / "step-000002", "aaa", 2)
    _fake_state(checkpoints / "step-000004", "aaa", 4)
    _fake_state(checkpoints / "step-000006", "bbb", 6)  # another config: never resumed from
    (checkpoints / "step-000008").mkdir()  # no state file
    _fake_state(checkpoints / "step-000010.tmp-x1", "aaa", 10)  # a killed write
    (checkpoints / "step-000012").mkdir()
    (checkpoints / "step-000012" / checkpoint.STATE_FILE).write_bytes(b"truncated")
    assert checkpoint.latest(checkpoints, "aaa")["progress"]["step"] == 4
    assert checkpoint.latest(checkpoints, "ccc") is None
    assert checkpoint.latest(tmp_path / "nowhere", "aaa") is None


def test_leftovers_of_killed_writers_are_cleaned_and_a_half_swapped_folder_restored(tmp_path):
    (tmp_path / "metrics.parquet.tmp-abc").write_bytes(b"half")
    (tmp_path / "checkpoints" / "step-000002.tmp-def").mkdir(parents=True)
    # Killed between the two renames of a folder swap: only the old complete version exists.
    (tmp_path / "checkpoints" / "final.old-xyz").mkdir()
    (tmp_path / "checkpoints" / "final.old-xyz" / "model.safetensors").write_bytes(b"old")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == ["metrics.parquet.tmp-abc", "step-000002.tmp-def"]
    assert (tmp_path / "checkpoints" / "final" / "model.safetensors").read_bytes() == b"old"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["final"]
