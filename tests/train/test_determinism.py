"""Determinism: the same seed on the same CPU machine gives identical samples.parquet content and
identical training metrics (all but the wall-clock `seconds`); another seed does not."""

import pyarrow.parquet as pq
import pytest

from rredcot_cli.config.compose import compose
from rredcot_cli.stages import sample, train
from rredcot_cli.train.steptime import CLOCK_COLUMNS

SMALL = ["benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=3", "sampling.max_new_tokens=40",
         "sample.num_prompts=3",
         "train.steps=3", "train.prompts_per_step=2", "train.minibatch_size=3", "train.updates_per_batch=2",
         "train.eval_every=2", "train.eval_problems=2", "train.eval_samples=2", "train.save_every=0"]


def run_stage(module, run_dir, *overrides):
    overrides = [f"run.dir={run_dir}", *SMALL, *overrides]
    module.run(compose(overrides), overrides)


@pytest.fixture(scope="module")
def runs_by_seed(tmp_path_factory):
    root = tmp_path_factory.mktemp("determinism")
    made = {}
    for name, seed in [("a", 0), ("b", 0), ("other", 1)]:
        run_stage(sample, root / name, f"seed={seed}")
        run_stage(train, root / name, f"seed={seed}")
        made[name] = root / name
    return made


def test_same_seed_same_samples(runs_by_seed):
    a, b = (pq.read_table(runs_by_seed[k] / "sample" / "samples.parquet") for k in ("a", "b"))
    assert a.num_rows == 9
    assert a.equals(b)
    other = pq.read_table(runs_by_seed["other"] / "sample" / "samples.parquet")
    assert other.column("completion") != a.column("completion")


def test_same_seed_same_training_metrics(runs_by_seed):
    def metrics(key):
        return pq.read_table(runs_by_seed[key] / "train" / "metrics.parquet").drop(list(CLOCK_COLUMNS))

    def rows(table):  # NaN (a step with no learning signal measures no entropy) equals NaN here
        return repr(table.to_pylist())

    a, b = metrics("a"), metrics("b")
    assert a.num_rows == 3 and a.column("eval_accuracy").null_count == 1
    assert a.schema.equals(b.schema) and rows(a) == rows(b)
    assert rows(a) != rows(metrics("other"))
    eval_a, eval_b = (pq.read_table(runs_by_seed[k] / "train" / "eval.parquet") for k in ("a", "b"))
    assert eval_a.equals(eval_b)
