"""train.data_order_seed (issue 39): null keeps the prompt stream every committed run trained on;
a number shuffles the whole train split afresh on each pass, by (seed, pass); a resumed run
continues the same order."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rredcot_cli.errors import PREEMPTED_EXIT
from rredcot_cli.store.runs import sha256_file
from rredcot_cli.train.loop import _cycle, training_samples
from rredcot_cli.train.steptime import CLOCK_COLUMNS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
TINY = [
    "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40",
    "train.steps=3", "train.prompts_per_step=2", "train.minibatch_size=4", "train.updates_per_batch=1",
    "train.eval_every=0", "train.eval_problems=2", "train.eval_samples=1", "train.save_every=0",
    "train.save_rollouts=1",
]
# Raises a preemption signal in the process itself while step 2 runs: the run stops after step 2
# with a checkpoint (train/preemption.py), deterministically.
PREEMPT_AT_STEP_2 = textwrap.dedent("""
    import os, signal, sys
    from rredcot_cli.train.loop import Trainer
    real = Trainer.step
    def step(self, number):
        if number == 2:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(self, number)
    Trainer.step = step
    sys.argv[0] = "rredcot"
""")


def train(run, *extra, wrapper=None):
    command = ([sys.executable, "-c", wrapper + "\nfrom rredcot_cli.cli import main; main()"] if wrapper
               else [sys.executable, "-m", "rredcot_cli"])
    return subprocess.run([*command, "train", f"run.dir={run}", *TINY, *extra], cwd=run.parent, env=ENV,
                          capture_output=True, text=True, timeout=600)


def trained(run, *extra):
    process = train(run, *extra)
    assert process.returncode == 0, process.stdout + process.stderr
    return run


def prompt_ids(run) -> list[list[str]]:
    """The prompt ids each step trained on, in order (from the saved rollouts)."""
    steps = sorted((run / "train" / "rollouts").iterdir())
    ids = []
    for folder in steps:
        rows = pq.read_table(folder / "sample" / "samples.parquet").to_pylist()
        ids.append(list(dict.fromkeys(row["prompt_id"] for row in rows)))
    return ids


def outcome(run):
    train_dir = run / "train"
    return {"prompts": prompt_ids(run),
            "metrics": pq.read_table(train_dir / "metrics.parquet").drop(list(CLOCK_COLUMNS)).to_pylist(),
            "weights": sha256_file(train_dir / "checkpoints" / "final" / "model.safetensors")}


# --------------------------------------------------------------------------- the stream itself


def test_without_a_seed_the_stream_is_the_split_in_order_wrapping_around():
    assert _cycle(list("abcde"), 3, 6) == list("deabcd")
    assert _cycle(list("abcde"), 3, 6, None) == list("deabcd")


def test_a_seed_shuffles_each_pass_and_the_stream_depends_on_the_position_alone():
    items = list(range(50))
    stream = _cycle(items, 0, 150, order_seed=7)
    for start in (0, 50, 100):  # each pass is the whole split, once
        assert sorted(stream[start:start + 50]) == items
    assert stream[:50] != items and stream[:50] != stream[50:100]  # shuffled, and afresh each pass
    assert _cycle(items, 0, 150, order_seed=7) == stream  # same seed, same order
    assert _cycle(items, 0, 150, order_seed=8)[:50] != stream[:50]  # another seed, another order
    for cursor in (1, 49, 50, 97):  # what a resumed run (cursor restored) draws next
        assert _cycle(items, cursor, 150 - cursor, order_seed=7) == stream[cursor:]


def test_dynamic_sampling_draws_along_the_same_seeded_stream():
    drawn = []

    def draw(problems, round_index):
        drawn.extend(problems)
        return [{"prompt_id": p, "reward": 1.0} for p in problems]  # never mixed: every round draws

    _, _, cursor, rounds = training_samples(draw, list(range(20)), 5, 3, dynamic=True, max_rounds=3, order_seed=4)
    assert (cursor, rounds) == (14, 3)
    assert drawn == _cycle(list(range(20)), 5, 9, order_seed=4)


# --------------------------------------------------------------------------- training runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("order")
    return {name: trained(root / name, *extra) for name, extra in [
        ("default", []), ("seed1", ["train.data_order_seed=1"]), ("seed2", ["train.data_order_seed=2"])]}


def test_the_default_stream_is_the_one_every_committed_run_trained_on(runs):
    # Hand-checked against main (9706c73), which has no train.data_order_seed: the same TINY run
    # trained on exactly these prompts, in this order, with the same metrics.
    assert prompt_ids(runs["default"]) == [["chain/train/0", "chain/train/1"], ["chain/train/2", "chain/train/3"],
                                           ["chain/train/4", "chain/train/5"]]


def test_data_order_seeds_draw_other_problems_in_other_orders(runs):
    one, two = prompt_ids(runs["seed1"]), prompt_ids(runs["seed2"])
    assert one != two and one != prompt_ids(runs["default"])
    flat = [pid for step in one for pid in step]
    assert len(set(flat)) == 6  # one pass: no problem twice
    # drawn from the whole split (1000 problems), not only the first steps x prompts_per_step
    assert max(int(pid.rsplit("/", 1)[1]) for pid in flat) >= 6


def test_a_preempted_seeded_run_resumes_the_same_order(runs, tmp_path):
    run = tmp_path / "resumed"
    stopped = train(run, "train.data_order_seed=1", wrapper=PREEMPT_AT_STEP_2)
    assert stopped.returncode == PREEMPTED_EXIT, stopped.stderr
    assert len(pq.read_table(run / "train" / "metrics.parquet")) == 2
    resumed = train(run, "train.data_order_seed=1", "train.resume=true")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "from step 2 of 3" in " ".join(resumed.stdout.split() + resumed.stderr.split())
    expected = outcome(runs["seed1"])
    assert any(row["grad_norm"] > 0 for row in expected["metrics"])  # the policy really moved
    assert outcome(run) == expected
