"""A training run you can watch and inspect (issue 14), on one tiny `rredcot train` run in a
subprocess: metrics.parquet holds every finished step while the run goes on, the TensorBoard
events hold the step scalars, every train.save_rollouts-th step's rollouts are stage artifacts
that heatmap and attribute read with train.step=N (and equal what attribute computes on them
with that step's policy), and train.keep_checkpoints leaves only the newest step checkpoints."""

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rredcot_cli.store import artifacts
from rredcot_cli.errors import ArtifactError

REPO = Path(__file__).resolve().parents[2]
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
STEPS = 4
TINY = [
    "seed=3", "method=rredcot", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4",
    "sampling.max_new_tokens=40", f"train.steps={STEPS}", "train.prompts_per_step=2", "train.minibatch_size=4",
    "train.updates_per_batch=1", "train.lr=1e-4", "train.warmup_steps=0", "train.eval_every=0",
    "train.eval_problems=2", "train.eval_samples=2", "train.save_every=1", "train.keep_checkpoints=2",
    "train.save_rollouts=2",
] + (["tracking=[tensorboard]"] if HAS_TENSORBOARD else [])


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def rredcot(*args, cwd, timeout=300):
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, env=_env(), capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"rredcot {args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """The run, and what a reader polling its metrics.parquet saw while it ran: each distinct list
    of steps (a read that fails, e.g. a torn file, is kept as its error)."""
    run = tmp_path_factory.mktemp("live") / "run"
    process = subprocess.Popen([sys.executable, "-m", "rredcot_cli", "train", f"run.dir={run}", *TINY],
                               cwd=run.parent, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = run / "train" / "metrics.parquet"
    seen, deadline = [], time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        if path.exists():
            try:
                steps = artifacts.read_artifact("train_metrics", path).column("step").to_pylist()
            except ArtifactError as e:
                steps = f"unreadable: {e}"
            if not seen or seen[-1] != steps:
                seen.append(steps)
        time.sleep(0.01)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, f"rredcot train failed:\n{out[-3000:]}\n{err[-3000:]}"
    return run, seen, err


def test_a_reader_sees_each_step_as_it_finishes(watched):
    run, seen, log = watched
    assert seen == [list(range(1, n + 1)) for n in range(1, STEPS + 1)]
    assert "acc " in log and "tok/s" in log and "kl " in log  # the progress line


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed (it is in the test extra)")
def test_train_with_tracking_tensorboard_writes_the_step_metrics(watched):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _, _ = watched
    events = EventAccumulator(str(run / "train" / "tensorboard"))
    events.Reload()
    metrics = pq.read_table(run / "train" / "metrics.parquet").to_pylist()
    for key in ("reward_mean", "accuracy", "loss", "grad_norm", "tokens"):
        logged = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        assert logged == [(row["step"], pytest.approx(row[key], rel=1e-6)) for row in metrics], key


def test_saved_rollouts_are_the_stage_artifacts(watched):
    run, _, _ = watched
    rollouts = run / "train" / "rollouts"
    assert sorted(p.name for p in rollouts.iterdir()) == ["step-000002", "step-000004"]
    for step in rollouts.iterdir():
        samples = artifacts.read_artifact("samples", step / "sample" / "samples.parquet")
        segments = artifacts.read_artifact("segments", step / "segment" / "segments.parquet")
        artifacts.validate_segments_tile(segments, samples)
        credits = artifacts.read_artifact("credits", step / "attribute" / "rredcot" / "credits.parquet")
        advantages = artifacts.read_artifact("advantages", step / "attribute" / "rredcot" / "advantages.parquet")
        assert samples.num_rows == advantages.num_rows == 2 * 4  # prompts_per_step x sampling.n
        assert credits.num_rows == segments.num_rows
        assert set(credits.column("method").to_pylist()) == {"rredcot"}
        assert all(v is not None for v in credits.column("value").to_pylist())  # rredcot has values
    # Step 2 and step 4 drew other problems.
    ids = [set(pq.read_table(p / "sample" / "samples.parquet").column("prompt_id").to_pylist())
           for p in sorted(rollouts.iterdir())]
    assert not ids[0] & ids[1]


def test_attribute_on_a_saved_step_with_that_steps_policy_gives_the_saved_credit(watched):
    run, _, _ = watched
    # Step 4's credit was computed by the policy after step 3's update: checkpoints/step-000003.
    policy = run / "train" / "checkpoints" / "step-000003"
    rredcot("attribute", f"run.dir={run}", "train.step=4", "run.tag=again", f"model.path={policy}", *TINY[:4],
            cwd=run.parent)
    step = run / "train" / "rollouts" / "step-000004"
    for kind, column in (("credits", "credit"), ("credits", "value"), ("advantages", "token_advantages")):
        saved = pq.read_table(step / "attribute" / "rredcot" / f"{kind}.parquet").column(column).to_pylist()
        again = pq.read_table(step / "attribute-again" / "rredcot" / f"{kind}.parquet").column(column).to_pylist()
        if column == "token_advantages":
            saved, again = [x for row in saved for x in row], [x for row in again for x in row]
        assert again == pytest.approx(saved, abs=1e-5), (kind, column)


def test_heatmap_renders_a_saved_training_step(watched):
    run, _, _ = watched
    log = rredcot("heatmap", f"run.dir={run}", "train.step=2", "method=rredcot", cwd=run.parent)
    folder = run / "train" / "rollouts" / "step-000002" / "heatmap" / "rredcot"
    assert f"{folder / 'heatmap.html'}" in log
    assert (folder / "heatmap.png").stat().st_size > 0
    assert "rendered" in log


def test_a_step_that_was_not_saved_is_refused_in_one_line(watched):
    run, _, _ = watched
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "heatmap", f"run.dir={run}", "train.step=3",
                             "method=rredcot"], cwd=run.parent, env=_env(), capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: train.step=3: {run / 'train'} holds no rollouts of step 3 (saved steps: 2, 4); "
        "`rredcot train train.save_rollouts=N` saves every N-th step"]


def test_keep_checkpoints_leaves_the_newest_step_checkpoints_and_final(watched):
    run, _, _ = watched
    # Steps 1-3 were saved (step 4 is the final checkpoint); keep_checkpoints=2 deleted step 1.
    assert sorted(p.name for p in (run / "train" / "checkpoints").iterdir()) == ["final", "step-000002", "step-000003"]
