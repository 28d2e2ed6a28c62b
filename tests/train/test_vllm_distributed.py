"""``backend=vllm`` under torchrun on the CPU (vLLM's CPU build, gloo, world size 2; CI's vLLM lane).

Every rank builds an in-process engine (rredcot_cli/policy/engine_groups.py), samples its share
of each generate call and syncs its engine after every update. Three runs, five engine starts in
all (about 3 min on CI's two cores):

* world size 1, the reference;
* DDP at world size 2, killed after its first checkpoint and resumed at world size 2;
* FSDP2 at world size 2.

Each run has ``backend.sync_check_atol=1e-4``: after every sync, on every rank, the engine scores a
fixed completion as the policy being trained does (fp32 on both sides) or the run stops; a rank
whose engine kept stale weights fails it (tests/policy/test_vllm_backend.py shows the check
catching one). The manifest records each rank's syncs and gaps, checked here. The world-size-2
runs equal world size 1 on the same batches: the same samples (per-request seeds from a prompt's
index in the whole call), the same metrics within the tolerances below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from processes import kill_tree

pytestmark = pytest.mark.vllm

SYNC_ATOL = 1e-4
# Two engines see other batch shapes than one, so vLLM's CPU kernels round the sampler's
# log-probs differently (1e-7 to 1e-6; they are not trained on: vLLM runs recompute the old
# log-probs); DDP and FSDP2 sum gradients in another order than one process (test_distributed.py).
METRIC_RTOL = 1e-4
LOGPROB_ATOL = 1e-4  # the columns that compare sampler and trainer log-probs
STEPS = 2
CLI = [
    "backend=vllm", "backend.device=cpu", "backend.kv_cache_gb=0.25", "backend.enforce_eager=true",
    f"backend.sync_check_atol={SYNC_ATOL}", "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3",
    "sampling.n=4", "sampling.max_new_tokens=32", f"train.steps={STEPS}", "train.save_every=1",
    "train.prompts_per_step=4", "train.minibatch_size=8", "train.updates_per_batch=2", "train.lr=3e-5",
    "train.lr_schedule=constant", "train.warmup_steps=1", f"train.eval_every={STEPS}", "train.eval_problems=4",
    "train.eval_samples=2", "train.dist_timeout_s=300", "method=grpo",
]


REPO = Path(__file__).resolve().parents[2]


def _train(run_dir: Path, *extra: str, world_size: int = 1) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the backend's own default: in process
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]
    command = (launcher if world_size > 1 else [sys.executable]) + ["-m", "rredcot_cli", "train",
                                                                    f"run.dir={run_dir}", *CLI, *extra]
    return subprocess.Popen(command, cwd=run_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(process, timeout: float = 600) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"rredcot train failed:\n{out[-3000:]}\n{err[-5000:]}"
    return out + err


def _metrics(run: Path) -> list[dict]:
    from rredcot_cli.train.steptime import CLOCK_COLUMNS

    return pq.read_table(run / "train" / "metrics.parquet").drop([*CLOCK_COLUMNS, "credit_forward_tokens"]).to_pylist()


def _assert_same_metrics(run: Path, reference: Path) -> None:
    got, expected = _metrics(run), _metrics(reference)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for row, want in zip(got, expected):
        for key, value in want.items():
            if isinstance(value, float) and (key.startswith("mismatch_") or key == "sampler_kl"):
                assert row[key] == pytest.approx(value, abs=LOGPROB_ATOL), (row["step"], key)
            elif isinstance(value, float):
                assert row[key] == pytest.approx(value, rel=METRIC_RTOL, abs=1e-6), (row["step"], key)
            else:
                assert row[key] == value, (row["step"], key)
    summaries = [json.loads((r / "train" / "summary.json").read_text()) for r in (run, reference)]
    assert summaries[0]["eval_after"]["pass@1"] == pytest.approx(summaries[1]["eval_after"]["pass@1"])
    assert summaries[0]["generated_tokens"] == summaries[1]["generated_tokens"]


def _weight_syncs(run: Path, world_size: int, syncs: int) -> list[dict]:
    """The manifest's per-rank sync record: every rank synced ``syncs`` times in this attempt
    through the in-process path, and every check is within the tolerance."""
    records = json.loads((run / "train" / "manifest.json").read_text())["extra"]["weight_sync"]
    assert [r["rank"] for r in records] == list(range(world_size))
    assert [r["engine_group"] for r in records] == list(range(world_size))  # tensor_parallel_size 1
    for record in records:
        assert record["method"] == "reload_weights:tensors"
        assert record["syncs"] == syncs and len(record["checks"]) == syncs, record
        assert max(record["checks"]) <= SYNC_ATOL, record
    return records


@pytest.fixture(scope="module")
def world_size_one(tmp_path_factory):
    pytest.importorskip("vllm")
    run = tmp_path_factory.mktemp("vllm-w1") / "run"
    _finish(_train(run))
    _weight_syncs(run, 1, STEPS)  # one sync after each update
    return run


def test_ddp_killed_at_world_size_two_resumes_to_the_world_size_one_run(world_size_one, tmp_path):
    run = tmp_path / "run"
    process = _train(run, "train.parallel=ddp", world_size=2)
    first_state = run / "train" / "checkpoints" / "step-000001"
    deadline = time.monotonic() + 600
    while not first_state.exists():
        assert process.poll() is None, f"the run ended before its first checkpoint: {process.communicate()}"
        assert time.monotonic() < deadline, "no checkpoint after 600 s"
        time.sleep(0.1)
    kill_tree(process.pid)
    process.communicate()
    log = _finish(_train(run, "train.parallel=ddp", "train.resume=true", world_size=2))
    assert "resuming" in log
    _assert_same_metrics(run, world_size_one)
    # The resumed attempt: a sync of the checkpoint's weights, then one after each remaining update.
    _weight_syncs(run, 2, 1 + STEPS - 1)


def test_fsdp2_at_world_size_two_equals_world_size_one(world_size_one, tmp_path):
    run = tmp_path / "run"
    _finish(_train(run, "train.parallel=fsdp2", world_size=2))
    _assert_same_metrics(run, world_size_one)
    # The sampler's full copy is synced once before the first step, then after every update.
    _weight_syncs(run, 2, 1 + STEPS)
