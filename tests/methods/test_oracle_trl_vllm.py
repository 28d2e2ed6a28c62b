"""Oracle and vLLM lanes, the TRL integration with TRL's colocated vLLM (issue 41 item 2):
``use_vllm=True, vllm_mode="colocate"`` on the CPU build of vLLM, a 2-step run of rredcot with
``value="suffix_is"`` (the estimator that reads the sampling log-probs) on the shipped tiny-chain
model, in one process and under torchrun DDP with two ranks (gloo; an engine per rank, as TRL's
colocate mode does; a group straddles the ranks). ``tests/trl_ddp_worker.py --colocate``; each run
starts its engines once, 2 to 3 min on two busy cores.

One TRL method is replaced for the run: TRL 1.16's colocate weight sync fails on vLLM's CPU build
(``trl_ddp_worker.cpu_weight_sync`` says why), so the worker syncs through vLLM's
``reload_weights`` instead; generation, scoring, the log-probs TRL hands on and the loss are TRL's.

- the sampling log-probs the integration gives ``compute_credit`` are vLLM's, as TRL received
  them on each rank (``sampling_per_token_logps``), in rank order, and they are the current
  policy's (the HF model with the weights of the moment gives them to vLLM's bf16 precision,
  the other step's weights do not: TRL's loop synced the engines after the first update);
- the per-token advantages each rank's loss used are its rows of ``compute_credit`` of the whole
  batch with those log-probs, which differs from what it gives without them (they matter);
- TRL's log keeps its columns and carries the credit columns of that credit.

Skips without TRL 1.16 or vLLM.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", minversion="1.16")
pytest.importorskip("vllm")

from processes import kill_tree  # noqa: E402
from trl_ddp_worker import NUM_GENERATIONS, PER_DEVICE, RUNS, TEMPERATURE  # noqa: E402

from rredcot_cli.credit import compute_credit, credit_statistics, policy_from_model  # noqa: E402

pytestmark = [pytest.mark.oracle, pytest.mark.vllm]

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
RUN = "rredcot-suffix_is"
# TRL builds its engine without a dtype, so vLLM runs the fp32 checkpoint downcast ("auto": bf16
# here): its log-probs are the current weights' to 0.005 to 0.01 on average (measured, one
# process), another step's weights are off by 1.4 to 2.3 on average.
CURRENT_MEAN_ATOL = 0.05


def _colocated(out: Path, world: int) -> list[dict]:
    """Each rank's file of the colocated run at world size ``world``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
    command = (launcher if world > 1 else [sys.executable]) + [str(TESTS / "trl_ddp_worker.py"), str(out),
                                                              "--colocate", RUN]
    process = subprocess.Popen(command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)  # the ranks too (torchrun starts them in sessions of their own)
        raise
    assert process.returncode == 0, f"the colocated run failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    return [torch.load(out / f"{RUN}-rank-{rank}.pt", weights_only=False) for rank in range(world)]


def _model(state):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(resources.files("rredcot_cli") / "assets" / "tiny-chain")
    model = AutoModelForCausalLM.from_pretrained(path)
    model.load_state_dict(state)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def _hf_logprobs(model, prompt_ids, completion_ids) -> list[torch.Tensor]:
    """Log-probs of each sampled token under ``model`` at the sampling temperature (vLLM's
    processed log-probs, as TRL asks for; one row at a time: no padding)."""
    rows = []
    with torch.no_grad():
        for prompt, completion in zip(prompt_ids, completion_ids):
            ids = torch.tensor([prompt + completion])
            logits = model(ids).logits[0, len(prompt) - 1: -1].float() / TEMPERATURE
            rows.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0])
    return rows


@pytest.mark.parametrize("world", [1, 2])
def test_colocated_vllm_log_probs_feed_the_credit(tmp_path, world):
    from rredcot_cli.benchmarks import make_benchmark

    benchmark = make_benchmark("chain", min_steps=2, max_steps=2)
    method, params = RUNS[RUN]
    files = _colocated(tmp_path, world)
    per_rank = PER_DEVICE[world]
    assert [f["world_size"] for f in files] == [world] * world
    assert all(len(f["records"]) == 2 for f in files)
    logged = [row for row in files[0]["log_history"] if "loss" in row and "reward" in row]
    assert len(logged) == 2  # TRL's own columns stay, one row per step
    first, second = files[0]["records"]
    assert any(not torch.equal(v, second["state"][k]) for k, v in first["state"].items())  # it trained

    for step in range(2):
        batches = [f["records"][step] for f in files]
        record = {key: [x for batch in batches for x in batch[key]]
                  for key in ("prompt_ids", "completion_ids", "completions", "rewards", "gold", "vllm_logprobs")}
        vllm_logprobs = record["vllm_logprobs"]
        assert all(batch["vllm_logprobs"] is not None for batch in batches), "TRL sampled without vLLM"
        assert all(batch["handed_logprobs"] == vllm_logprobs for batch in batches)  # vLLM's, every rank's
        assert all(lp and all(x <= 0 for x in lp) for lp in vllm_logprobs)
        assert any(x < -1e-3 for lp in vllm_logprobs for x in lp)
        sampled = torch.tensor([x for lp in vllm_logprobs for x in lp])

        def gap(state) -> float:  # mean |vLLM's - the HF model's with these weights| over sampled tokens
            model, _ = _model(state)
            return float((torch.cat(_hf_logprobs(model, record["prompt_ids"], record["completion_ids"])) - sampled)
                         .abs().mean())

        current, other = gap(batches[0]["state"]), gap(files[0]["records"][1 - step]["state"])
        assert current < CURRENT_MEAN_ATOL and other > 10 * current, (step, current, other)  # the engine was synced
        model, tokenizer = _model(batches[0]["state"])

        def credit(logprobs):
            return compute_credit(
                record["prompt_ids"], record["completion_ids"], torch.tensor(record["rewards"]),
                torch.arange(len(record["rewards"])) // NUM_GENERATIONS, tokenizer=tokenizer, method=method,
                method_params=params, sampling_logprobs=logprobs,
                policy=policy_from_model(model, tokenizer, batch_size=16), gold_answers=record["gold"],
                pred_answers=[benchmark.extract_answer(t) for t in record["completions"]])

        with torch.no_grad():
            result, without = credit(vllm_logprobs), credit(None)
        assert not torch.allclose(without.token_advantages, result.token_advantages, atol=1e-4)
        for rank, batch in enumerate(batches):
            used, mask = batch["advantages"], batch["completion_mask"].bool()
            expected = result.token_advantages[rank * per_rank: (rank + 1) * per_rank]
            width = min(used.shape[1], expected.shape[1])
            torch.testing.assert_close(used[:, :width], expected[:, :width], rtol=1e-5, atol=1e-6)
            assert not used[~mask].any()

        stats = credit_statistics(result)
        assert stats
        for name, value in stats.items():
            assert math.isclose(logged[step][f"credit/{name}"], value, rel_tol=1e-5, abs_tol=1e-6), (step, name)
