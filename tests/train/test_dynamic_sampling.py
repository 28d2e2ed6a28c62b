"""DAPO's dynamic sampling in the training loop (train.dynamic_sampling): which groups a step
trains on, how the data cursor moves, and that a resumed run continues from the saved cursor."""

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from rredcot_cli.store import artifacts
from rredcot_cli.train.loop import training_samples
from rredcot_cli.train.steptime import CLOCK_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fake_draw(rewards_of, calls):
    """A sampler whose problem p gets the rewards ``rewards_of(p)`` (one completion each)."""
    def draw(problems, round_index):
        calls.append((list(problems), round_index))
        return [{"prompt_id": f"p{p}", "sample_idx": j, "reward": r} for p in problems
                for j, r in enumerate(rewards_of(p))]
    return draw


def mixed_every_third(p):
    return [0.0, 1.0] if p % 3 == 0 else [1.0, 1.0] if p % 2 else [0.0, 0.0]


def test_without_dynamic_sampling_one_draw_is_the_batch():
    calls = []
    trained, drawn, cursor, rounds = training_samples(fake_draw(mixed_every_third, calls), list(range(100)), 4, 3,
                                                      dynamic=False, max_rounds=5)
    assert calls == [([4, 5, 6], 0)]
    assert trained == drawn and len(drawn) == 6  # uniform groups stay in the batch
    assert (cursor, rounds) == (7, 1)


def test_dynamic_sampling_keeps_the_first_mixed_groups_and_moves_the_cursor():
    calls = []
    trained, drawn, cursor, rounds = training_samples(fake_draw(mixed_every_third, calls), list(range(100)), 0, 3,
                                                      dynamic=True, max_rounds=5)
    # Draws of 3 problems: [0 1 2] -> p0; [3 4 5] -> p3; [6 7 8] -> p6 (three mixed groups).
    assert calls == [([0, 1, 2], 0), ([3, 4, 5], 1), ([6, 7, 8], 2)]
    assert sorted({r["prompt_id"] for r in trained}) == ["p0", "p3", "p6"]
    assert len(drawn) == 18 and (cursor, rounds) == (9, 3)
    assert all(len({r["reward"] for r in trained if r["prompt_id"] == p}) == 2 for p in ("p0", "p3", "p6"))


def test_dynamic_sampling_drops_extra_mixed_groups_and_stops_at_max_rounds():
    always_mixed = fake_draw(lambda p: [0.0, 1.0], [])
    trained, _, cursor, rounds = training_samples(always_mixed, list(range(100)), 0, 2, dynamic=True, max_rounds=5)
    assert sorted({r["prompt_id"] for r in trained}) == ["p0", "p1"] and (cursor, rounds) == (2, 1)

    never_mixed = fake_draw(lambda p: [1.0, 1.0], [])
    trained, drawn, cursor, rounds = training_samples(never_mixed, list(range(100)), 10, 2, dynamic=True,
                                                      max_rounds=3)
    assert trained == [] and len(drawn) == 12 and (cursor, rounds) == (16, 3)


def test_dynamic_sampling_does_not_keep_a_wrapped_around_problem_twice():
    # A split of two problems, only p0 mixed: the second draw meets p0 again and must skip it.
    trained, _, _, rounds = training_samples(fake_draw(lambda p: [0.0, 1.0] if p == 0 else [1.0, 1.0], []),
                                             [0, 1], 0, 2, dynamic=True, max_rounds=3)
    assert [r["prompt_id"] for r in trained] == ["p0", "p0"] and rounds == 3


def test_metrics_written_before_the_new_columns_still_read(tmp_path):
    row = {name: 1 for name in ("step", "tokens")}
    row.update({name: 0.5 for name in ("reward_mean", "accuracy", "loss", "kl", "entropy", "clip_fraction",
                                        "grad_norm", "lr", "response_tokens_mean", "seconds")})
    row["eval_accuracy"] = None
    old_schema = pa.schema([f for f in artifacts.TRAIN_METRICS if f.name not in
                            ("sampling_rounds", "groups_trained", "value_loss", "value_explained_variance")])
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), tmp_path / "metrics.parquet")
    table = artifacts.read_artifact("train_metrics", tmp_path / "metrics.parquet")
    assert table.column("sampling_rounds").to_pylist() == [None]
    assert table.column("value_loss").to_pylist() == [None]
    # A writer may leave the added columns out; a core column is still required.
    written = artifacts.write_artifact("train_metrics", [row], tmp_path / "new.parquet")
    assert pq.read_table(written).column("groups_trained").to_pylist() == [None]
    del row["loss"]
    try:
        artifacts.write_artifact("train_metrics", [row], tmp_path / "bad.parquet")
    except artifacts.ArtifactError as e:
        assert "missing columns: loss" in str(e)
    else:
        raise AssertionError("a metrics row without loss was written")


# ------------------------------------------------------------------ the CLI on the embedded model

TINY = ["seed=2", "experiment=dapo", "method.max_length=40", "method.cache_length=8", "benchmark.min_steps=2",
        "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40", "train.steps=4", "train.save_every=2",
        "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=0", "train.eval_problems=2",
        "train.eval_samples=2"]


def rredcot(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def metrics_without_clock(run):
    return pq.read_table(run / "train" / "metrics.parquet").drop(list(CLOCK_COLUMNS)).to_pylist()


def test_train_with_dynamic_sampling_resumes_from_the_saved_cursor(tmp_path):
    whole = tmp_path / "whole"
    rredcot("train", f"run.dir={whole}", *TINY, cwd=tmp_path)
    metrics = metrics_without_clock(whole)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(1 <= m["sampling_rounds"] <= 4 and 0 <= m["groups_trained"] <= 2 for m in metrics)
    # The setting makes uniform groups common, so the cursor runs ahead of step x prompts_per_step
    # before the step-2 checkpoint: resuming from step * prompts_per_step would draw other problems.
    assert sum(m["sampling_rounds"] for m in metrics[:2]) > 2
    state_file = whole / "train" / "checkpoints" / "step-000002" / "trainer_state.pt"
    import torch

    progress = torch.load(state_file, weights_only=True)["progress"]
    assert progress["cursor"] == 2 * sum(m["sampling_rounds"] for m in metrics[:2])

    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    manifest_path = resumed / "train" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["status"] = "running"  # as if killed after the step-2 checkpoint
    manifest_path.write_text(json.dumps(manifest))
    for name in ("eval.parquet", "summary.json"):
        (resumed / "train" / name).unlink()
    # metrics.parquet holds the steps after the checkpoint too (as after a kill past it), here made
    # wrong: the resume keeps steps 1-2 from the file and makes steps 3-4 again.
    # Written as one file, as runs before the folder of parts wrote it: the resume reads that too.
    rows = pq.read_table(resumed / "train" / "metrics.parquet").to_pylist()
    shutil.rmtree(resumed / "train" / "metrics.parquet")
    artifacts.write_artifact("train_metrics", rows[:2] + [{**row, "reward_mean": -1.0} for row in rows[2:]],
                             resumed / "train" / "metrics.parquet")
    shutil.rmtree(resumed / "train" / "checkpoints" / "final")
    log = rredcot("train", f"run.dir={resumed}", *TINY, "train.resume=true", cwd=tmp_path)
    assert "from step 2 of 4" in " ".join(log.split())
    assert metrics_without_clock(resumed) == metrics


def test_a_step_without_mixed_groups_updates_nothing_and_training_goes_on(tmp_path):
    # One completion per prompt: every group is uniform, so dynamic sampling never finds one.
    run = tmp_path / "run"
    log = rredcot("train", f"run.dir={run}", "method=grpo", "train.dynamic_sampling=true", "train.max_sampling_rounds=2",
                  "sampling.n=1", "sampling.max_new_tokens=40", "benchmark.min_steps=2", "benchmark.max_steps=3",
                  "train.steps=2", "train.prompts_per_step=2", "train.eval_every=0", "train.eval_problems=2",
                  "train.eval_samples=2", cwd=tmp_path)
    assert "no group with differing rewards in 2 draws" in " ".join(log.split())
    metrics = pq.read_table(run / "train" / "metrics.parquet").to_pylist()
    assert [(m["sampling_rounds"], m["groups_trained"]) for m in metrics] == [(2, 0), (2, 0)]
    assert all(m["loss"] != m["loss"] for m in metrics)  # NaN: no update was taken
    summary = json.loads((run / "train" / "summary.json").read_text())
    assert summary["eval_after"] == summary["eval_before"]  # same weights, same eval seed
