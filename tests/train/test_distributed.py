"""Data-parallel training (rredcot_cli/train/distributed.py) on the CPU: gloo, world size 2.

* The sharding rules, as properties.
* One policy update under DDP and FSDP2 equals the one-process update that accumulates the same
  minibatch in two halves: exactly under DDP (each rank's loss is its half's sum over the global
  count times 2, and 2x, the gloo sum of two values and DDP's /2 are exact in binary floating
  point), to 1e-6 under FSDP2 (the gradient norm for clipping is summed shard by shard, in
  another order); a rank with fewer rows than the others (a zero-weighted pass) to 1e-6. Dividing each rank's loss by its own token count instead (the naive way)
  changes the gradient by far more.
* `torchrun ... rredcot train` at world size 2 (ddp and fsdp2) writes the same artifacts with the
  same metrics and final weights as world size 1 (tolerance below); a run killed at world size
  2 resumes to the same result, at world size 2 (FSDP2) or in one process (DDP).
* Ranks that generate different lengths, or are out of rows, do not hang (a 60 s collective
  timeout turns a hang into a failure); a storage error on rank 0 while it checkpoints stops every
  rank at once with rank 0's message.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from processes import fake_slurm_tools, free_port, kill_tree
from safetensors.torch import load_file

from rredcot_cli.train.distributed import DataParallel, split_evenly
from rredcot_cli.train.steptime import CLOCK_COLUMNS

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = REPO / "rredcot_cli" / "assets" / "tiny-chain"
# Tolerances of the world-size-2 CLI runs against world size 1: the samples are the same (same
# per-chunk seeds), each minibatch's gradient is summed over ranks in another order than over
# micro-batches in one process, and three steps of AdamW carry that rounding into the weights.
WEIGHT_ATOL = 1e-5
METRIC_RTOL = 1e-4
# The sampler/trainer mismatch columns (mismatch.py) measure float rounding itself (HF sampler and
# trainer are one fp32 model: |delta log p| of 1e-8 mean, a few 1e-6 max), which other micro-batch
# shapes on two ranks change: compared at the HF backend's bound on that rounding (old_from_sampler).
MISMATCH_ATOL = 1e-4


# --------------------------------------------------------------------------- sharding rules


@given(st.lists(st.integers(), max_size=40), st.integers(1, 6))
def test_split_evenly_is_contiguous_and_balanced(items, parts):
    split = split_evenly(items, parts)
    assert len(split) == parts
    assert [x for part in split for x in part] == items
    assert max(map(len, split)) - min(map(len, split)) <= 1


@given(st.integers(0, 50), st.integers(1, 4), st.integers(1, 8))
def test_every_rank_makes_the_same_number_of_passes_enough_for_its_share(count, world, per_pass):
    ranks = [DataParallel(rank=r, world_size=world) for r in range(world)]
    passes = {p.passes(count, per_pass) for p in ranks}
    assert len(passes) == 1
    assert all(len(p.share(range(count))) <= passes.pop() * per_pass or count == 0 for p in ranks[:1])


def test_groups_are_never_split_over_ranks():
    rows = [{"prompt_id": p, "sample_idx": i} for p in "abcde" for i in range(3)]
    shares = [DataParallel(rank=r, world_size=2).groups_share(rows) for r in range(2)]
    assert shares[0] + shares[1] == rows
    assert {r["prompt_id"] for r in shares[0]} == {"a", "b", "c"}


def test_one_process_is_the_identity():
    one = DataParallel()
    assert one.map_chunks(lambda i, c: [i, c], ["x", "y"]) == [[0, "x"], [1, "y"]]
    assert one.sum([1.0, 2.0]) == [1.0, 2.0]
    assert one.share([1, 2, 3]) == [1, 2, 3] and one.passes(5, 2) == 3
    t = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(one.concat_rows(t, 4)[:, :3], t)


# --------------------------------------------------------------------------- one update


def _batch(seed: int = 0):
    """8 rows with prompts and completions of different lengths (the halves hold different token
    counts, which is what makes the naive normalisation wrong) and random advantages."""
    g = torch.Generator().manual_seed(seed)
    lengths = [3, 11, 5, 9, 12, 4, 6, 10]
    prompts = [torch.randint(5, 90, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
               for _ in lengths]
    completions = [torch.randint(5, 90, (n,), generator=g).tolist() for n in lengths]
    advantages = torch.randn(len(lengths), max(lengths), generator=g)
    for i, n in enumerate(lengths):
        advantages[i, n:] = 0
    return prompts, completions, advantages


def _model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)


def _update(model, parallel: DataParallel, rows_per_pass: int, minibatch_size: int = 8):
    """One policy update of the 8-row batch, two passes over it (mu = 2) in minibatches of
    ``minibatch_size``; returns its stats and the model's weights after it."""
    from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update
    from rredcot_cli.policy.logprobs import ForwardPass
    from rredcot_cli.train.loss import LossSettings

    prompts, completions, advantages = _batch()
    trained, plain, _ = parallel.wrap(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    stats = policy_update(
        trained, optimizer, scheduler,
        UpdateBatch(prompt_ids=prompts, completion_ids=completions, advantages=advantages, pad_id=0),
        UpdateHyper(updates_per_batch=2, minibatch_size=minibatch_size, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                    loss_agg="token-mean", max_tokens=12)),
        UpdateEngine(generator=torch.Generator().manual_seed(1),
                     forward=ForwardPass(micro_batch_size=rows_per_pass, chunk_tokens=4), parallel=parallel))
    parallel.refresh(trained, plain)
    return stats, {k: v.detach().clone() for k, v in plain.state_dict().items()}


def _naive_gradient_gap(rank: int) -> float:
    """Max |gradient difference| between the one-process token-mean gradient of the batch and
    DDP over per-rank token means (each rank dividing by its own count)."""
    from rredcot_cli.policy.logprobs import ForwardPass
    from rredcot_cli.train.loss import LossSettings, policy_loss

    prompts, completions, advantages = _batch()
    reference = _model()
    lp, mask, _ = ForwardPass().logprobs(reference, prompts, completions, 0, False)
    loss, _ = policy_loss(lp, lp.detach(), advantages, mask, LossSettings(clip_low=0.2, clip_high=0.2,
                          loss_agg="token-mean"))
    loss.backward()
    expected = {k: p.grad for k, p in reference.named_parameters()}
    parallel = DataParallel(rank=rank, world_size=2, mode="ddp")
    trained, plain, _ = parallel.wrap(_model())
    mine = parallel.share(range(8))
    lp, mask, _ = trained([prompts[i] for i in mine], [completions[i] for i in mine], 0, False)
    loss, _ = policy_loss(lp, lp.detach(), advantages[mine, : lp.shape[1]], mask, LossSettings(clip_low=0.2,
                          clip_high=0.2, loss_agg="token-mean"))
    loss.backward()
    return max(float((p.grad - expected[k]).abs().max()) for k, p in plain.named_parameters())


def _worker(rank: int, mode: str, rows_per_pass: int, minibatch_size: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        parallel = DataParallel(rank=rank, world_size=2, mode=mode)
        stats, weights = _update(_model(), parallel, rows_per_pass, minibatch_size)
        gap = _naive_gradient_gap(rank) if mode == "ddp" else None
        # Ranks that generate different lengths from the plain model and then meet in a
        # collective: the sampler holds full weights, so nothing waits inside generate.
        model = _model()
        _, plain, _ = parallel.wrap(model)
        with torch.no_grad():
            plain.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2 + 30 * rank, min_new_tokens=2 + 30 * rank,
                           do_sample=False, pad_token_id=0)
        parallel.barrier()
        if rank == 0:
            torch.save({"stats": vars(stats), "weights": weights, "naive_gap": gap}, out)
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path: Path, mode: str, rows_per_pass: int, minibatch_size: int = 8) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path / f"{mode}.pt"
    mp.spawn(_worker, args=(mode, rows_per_pass, minibatch_size, str(tmp_path / f"rendezvous-{mode}"), str(out)),
             nprocs=2, join=True)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def one_process_update():
    """The same update in one process, the minibatch accumulated in two halves of 4 rows."""
    return _update(_model(), DataParallel(), rows_per_pass=4)


def test_ddp_update_equals_the_one_process_update_exactly(one_process_update, tmp_path):
    """Each rank runs one half in one pass, as the one process's two micro-batches do."""
    stats, weights = one_process_update
    result = _spawn(tmp_path, "ddp", rows_per_pass=4)
    assert stats.updates == result["stats"]["updates"] == 2
    for name, tensor in weights.items():
        assert torch.equal(result["weights"][name], tensor), name
    assert result["stats"]["loss"] == pytest.approx(stats.loss, rel=1e-6, abs=1e-9)
    assert result["stats"]["grad_norm"] == pytest.approx(stats.grad_norm, rel=1e-6)
    # Counter-test: per-rank normalisation gives another gradient.
    assert result["naive_gap"] > 1e-4


def test_fsdp2_update_equals_the_one_process_update(one_process_update, tmp_path):
    """Each rank runs one half in one pass. Not bitwise: the gradient norm for clipping is summed
    shard by shard. (Passes of another size change even the one-process update by ~1e-5 after two
    AdamW steps at lr 1e-3, from float rounding alone, which is why the shapes are kept equal.)"""
    stats, weights = one_process_update
    result = _spawn(tmp_path, "fsdp2", rows_per_pass=4)
    assert result["weights"].keys() == weights.keys()
    gap = max(float((result["weights"][k] - v).abs().max()) for k, v in weights.items())
    assert gap <= 1e-6
    assert result["stats"]["grad_norm"] == pytest.approx(stats.grad_norm, rel=1e-5)


def test_a_rank_out_of_rows_takes_part_without_changing_the_update(tmp_path):
    """Minibatches of 3, 3 and 2 rows, one row per pass: rank 1 has one row where rank 0 has
    two, so it adds a zero-weighted pass; the update still equals the one-process one."""
    stats, weights = _update(_model(), DataParallel(), rows_per_pass=1, minibatch_size=3)
    result = _spawn(tmp_path, "ddp", rows_per_pass=1, minibatch_size=3)
    assert result["stats"]["updates"] == stats.updates == 6
    gap = max(float((result["weights"][k] - v).abs().max()) for k, v in weights.items())
    assert gap <= 1e-6
    assert result["stats"]["loss"] == pytest.approx(stats.loss, rel=1e-5, abs=1e-8)


# --------------------------------------------------------------------------- rank 0 failing to checkpoint

# The collective timeout of the test below (train.dist_timeout_s): before rank 0's failure was shared,
# rank 1 waited for it at a barrier until this timeout.
CHECKPOINT_TIMEOUT_S = 15


def _checkpoint_worker(rank: int, rendezvous: str, run_dir: str) -> None:
    """Both ranks save step 1's checkpoint; rank 0's disk is full. Each writes what happened to it
    (``rank-N.json``: the exception it stopped with, and the seconds save took)."""
    import errno

    import torch.distributed as dist
    from transformers import AutoTokenizer

    from rredcot_cli.train import checkpoint, trainable
    from rredcot_cli.train.precision import GradientStepper, Precision

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=CHECKPOINT_TIMEOUT_S))
    run_dir = Path(run_dir)
    try:
        parallel = DataParallel(rank=rank, world_size=2, mode="ddp")
        trained, plain, _ = parallel.wrap(_model())
        optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-3)
        parts = checkpoint.Stateful(trained, plain, parallel, AutoTokenizer.from_pretrained(TINY_MODEL), optimizer,
                                    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), torch.Generator(),
                                    None, GradientStepper(Precision("fp32", torch.float32, None)))
        if rank == 0:  # the weights' write finds the disk full, as safetensors says it
            def full(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")

            trainable.save_trained_weights = full
        began = time.monotonic()
        try:
            checkpoint.save(run_dir / "checkpoints" / "step-000001", checkpoint.TrainState(step=1), parts, "hash")
            outcome = "saved"
        except Exception as e:  # noqa: BLE001 - what each rank stopped with is the result
            outcome = f"{type(e).__name__}: {e}"
        (run_dir / f"rank-{rank}.json").write_text(json.dumps({"outcome": outcome,
                                                                "seconds": time.monotonic() - began}))
        # Rank 0 stays until rank 1 has its outcome: a rank 0 that had exited would break rank 1's
        # wait with a closed connection, not show whether the failure reached it.
        deadline = time.monotonic() + CHECKPOINT_TIMEOUT_S + 60
        while rank == 0 and not (run_dir / "rank-1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        dist.destroy_process_group()


def test_rank_0_failing_to_checkpoint_stops_every_rank_with_its_message(tmp_path):
    """A full disk on rank 0 while it writes a step checkpoint: every rank stops at once with rank
    0's one-line StorageError (before: rank 1 waited at the barrier until the collective timeout)."""
    import torch.multiprocessing as mp

    mp.spawn(_checkpoint_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    target = tmp_path / "checkpoints" / "step-000001"
    assert ranks[0]["outcome"].startswith(f"StorageError: cannot write {target}: No space left on device"), ranks
    assert ranks[1]["outcome"] == ranks[0]["outcome"], ranks
    assert ranks[1]["seconds"] < CHECKPOINT_TIMEOUT_S, ranks
    assert not target.exists() and not [p for p in target.parent.iterdir() if p.name.startswith(target.name)]


# --------------------------------------------------------------------------- the CLI under torchrun

CLI = [
    "seed=3", "benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=40",
    "train.steps=3", "train.save_every=1", "train.prompts_per_step=4", "train.minibatch_size=8",
    "train.updates_per_batch=2", "train.lr=3e-5", "train.lr_schedule=constant", "train.warmup_steps=1",
    "train.eval_every=3", "train.eval_problems=4", "train.eval_samples=2", "backend.batch_size=8",
    "train.micro_batch_size=3", "train.dist_timeout_s=120", "train.save_rollouts=2",
]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _train(run_dir: Path, *extra: str, world_size: int = 1) -> subprocess.Popen:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]
    command = (launcher if world_size > 1 else [sys.executable]) + ["-m", "rredcot_cli", "train",
               f"run.dir={run_dir}",
                                                                    *CLI, *extra]
    return subprocess.Popen(command, cwd=run_dir.parent, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(process: subprocess.Popen, timeout: float = 300) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"rredcot train failed:\n{out[-3000:]}\n{err[-3000:]}"
    return out + err


def _metrics(run: Path) -> list[dict]:
    # Wall-clock columns, and the value-estimation positions (rank 0's share under torchrun).
    return pq.read_table(run / "train" / "metrics.parquet").drop([*CLOCK_COLUMNS,
                         "credit_forward_tokens"]).to_pylist()


def _assert_same_run(run: Path, reference: Path) -> None:
    got, expected = _metrics(run), _metrics(reference)
    assert [r["step"] for r in got] == [1, 2, 3]
    for row, want in zip(got, expected):
        for key, value in want.items():
            if isinstance(value, float) and key.startswith("mismatch_"):
                assert row[key] == pytest.approx(value, abs=MISMATCH_ATOL), (row["step"], key)
            elif isinstance(value, float):
                assert row[key] == pytest.approx(value, rel=METRIC_RTOL, abs=1e-6), (row["step"], key)
            else:
                assert row[key] == value, (row["step"], key)
    final = "train/checkpoints/final/model.safetensors"
    a, b = load_file(run / final), load_file(reference / final)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= WEIGHT_ATOL
    # The same artifacts, written once.
    names = sorted(p.relative_to(reference).as_posix() for p in (reference / "train").rglob("*") if p.is_file())
    assert sorted(p.relative_to(run).as_posix() for p in (run / "train").rglob("*") if p.is_file()) == names
    # The saved rollouts hold every group's segment credit, gathered from the ranks that scored them.
    for name in (n for n in names if n.endswith("credits.parquet")):
        got_credit, want_credit = (pq.read_table(r / name).to_pylist() for r in (run, reference))
        assert [(c["prompt_id"], c["sample_idx"], c["segment_idx"]) for c in got_credit] == \
            [(c["prompt_id"], c["sample_idx"], c["segment_idx"]) for c in want_credit]
        for field in ("credit", "value"):
            assert [c[field] for c in got_credit] == pytest.approx([c[field] for c in want_credit], abs=1e-5), name
    summary = json.loads((run / "train" / "summary.json").read_text())
    assert summary["eval_after"]["pass@1"] == pytest.approx(
        json.loads((reference / "train" / "summary.json").read_text())["eval_after"]["pass@1"])


@pytest.fixture(scope="module")
def world_size_one(tmp_path_factory):
    run = tmp_path_factory.mktemp("w1") / "run"
    _finish(_train(run, "method=rredcot"))
    return run


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_torchrun_world_size_two_matches_world_size_one(world_size_one, tmp_path, mode):
    run = tmp_path / "run"
    _finish(_train(run, "method=rredcot", f"train.parallel={mode}", world_size=2))
    _assert_same_run(run, world_size_one)


@pytest.mark.parametrize("mode, resume_world_size", [("fsdp2", 2), ("ddp", 1)])
def test_run_killed_at_world_size_two_resumes_to_the_same_result(world_size_one, tmp_path, mode, resume_world_size):
    """FSDP2 killed and resumed at world size 2; DDP killed at world size 2 and resumed in one
    process (checkpoints hold full weights and a name-keyed optimizer state)."""
    run = tmp_path / "run"
    process = _train(run, "method=rredcot", f"train.parallel={mode}", world_size=2)
    first_state = run / "train" / "checkpoints" / "step-000001"
    deadline = time.monotonic() + 300
    while not first_state.exists():
        assert process.poll() is None, f"the run ended before its first checkpoint: {process.communicate()}"
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.05)
    kill_tree(process.pid)  # both ranks (torchrun starts them in sessions of their own), then torchrun
    process.communicate()
    # Live metrics: what the killed run left holds the steps that finished, in order, readable.
    killed_metrics = run / "train" / "metrics.parquet"
    assert killed_metrics.exists()
    steps = [row["step"] for row in pq.read_table(killed_metrics).to_pylist()]
    assert steps and steps == list(range(1, len(steps) + 1))
    log = _finish(_train(run, "method=rredcot", f"train.parallel={mode}", "train.resume=true",
                         world_size=resume_world_size))
    assert "resuming" in log
    _assert_same_run(run, world_size_one)


def test_the_slurm_script_trains_with_a_fake_srun_on_one_node(world_size_one, tmp_path):
    """scripts/slurm/train.sbatch with stand-ins for srun and scontrol: one node, two processes,
    the c10d rendezvous on localhost; the run equals world size 1 like a torchrun one."""
    bin_dir = tmp_path / "bin"
    fake_slurm_tools(bin_dir)
    port = free_port()
    run = tmp_path / "run"
    env = {**_env(), "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
           "RUN_DIR": str(run), "GPUS_PER_NODE": "2", "RDZV_PORT": str(port), "SLURM_JOB_NODELIST": "node1",
           "SLURM_NNODES": "1", "SLURM_JOB_ID": "4242"}
    process = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "train.sbatch"), *CLI, "method=rredcot",
                              "train.parallel=ddp"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    _assert_same_run(run, world_size_one)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("override, message", [
    (["train.parallel=fsdp2", "train.precision=fp16-mixed"], "fp16 loss scaling"),
    (["backend=vllm", "backend.tensor_parallel_size=2", "method=mc"], "method=mc with backend=vllm under torchrun"),
])
def test_what_data_parallelism_does_not_support_is_refused_in_one_line(monkeypatch, tmp_path, override, message):
    from rredcot_cli.train import distributed
    from rredcot_cli.config.compose import compose
    from rredcot_cli.errors import TrainingError
    from rredcot_cli.stages import train

    monkeypatch.setattr(distributed, "init", lambda mode, timeout: DataParallel(rank=0, world_size=2, mode=mode))
    cfg = compose([f"run.dir={tmp_path}", *override])
    with pytest.raises(TrainingError, match=message) as error:
        train.run(cfg, override)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "train").exists()


def test_an_unknown_parallel_mode_is_refused_before_anything_runs(tmp_path):
    from rredcot_cli.config.compose import compose
    from rredcot_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="train.parallel=zero3: not a valid choice; valid: ddp, fsdp2"):
        compose([f"run.dir={tmp_path}", "train.parallel=zero3"])
    assert not (tmp_path / "train").exists()
