"""Oracle lane, the TRL integration under torchrun DDP (issue 41 item 2): two CPU processes (gloo),
plain ``generate``, a 2-step run each of methods grpo and rredcot on the shipped tiny-chain model
(``tests/trl_ddp_worker.py`` is one rank; both runs share one launch, about a minute on two busy cores).

What each rank's loss got is checked against what one process computes from the ranks' own rows:

- TRL's order: rank 0's rows then rank 1's form whole groups of ``num_generations`` (each group
  one prompt), with the second group straddling the ranks;
- the per-token advantages each rank's loss used equal ``compute_credit`` of that whole batch
  (rebuilt from each rank's own prompt and completion ids, rewards and answers, with the weights of
  the moment), rows of the rank's own slice;
- with grpo (TRL's eps), they equal TRL's own (B,) advantages of the same batch under DDP on every
  completion token;
- rank 0's logs keep TRL's columns and carry the credit columns, equal to the statistics of that
  whole-batch credit.

Skips without TRL (``pip install trl==1.16.0``).
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

from processes import kill_tree  # noqa: E402
from trl_ddp_worker import NUM_GENERATIONS, PER_DEVICE, RUNS  # noqa: E402

from rredcot_cli.benchmarks import make_benchmark  # noqa: E402
from rredcot_cli.credit import compute_credit, credit_statistics, policy_from_model  # noqa: E402

pytestmark = pytest.mark.oracle

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
WORLD = 2
PER_RANK = PER_DEVICE[WORLD]
RUN_NAMES = ("grpo", "rredcot")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """{method: [rank 0's file, rank 1's file]} from one torchrun launch of both runs."""
    out = tmp_path_factory.mktemp("trl-ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               str(TESTS / "trl_ddp_worker.py"), str(out), *RUN_NAMES]
    process = subprocess.Popen(command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)  # both ranks (torchrun starts them in sessions of their own), then torchrun
        raise
    assert process.returncode == 0, f"torchrun failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    return {method: [torch.load(out / f"{method}-rank-{rank}.pt", weights_only=False) for rank in range(WORLD)]
            for method in RUN_NAMES}


def _whole_batch_credit(method: str, batches: list[dict]):
    """One process's credit of the generation batch the ranks' own rows make up, in rank order."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(resources.files("rredcot_cli") / "assets" / "tiny-chain")
    tokenizer = AutoTokenizer.from_pretrained(path)
    benchmark = make_benchmark("chain", min_steps=2, max_steps=2)
    whole = {key: [x for batch in batches for x in batch[key]]
             for key in ("prompt_ids", "completion_ids", "completions", "rewards", "gold")}
    model = AutoModelForCausalLM.from_pretrained(path)
    model.load_state_dict(batches[0]["state"])
    model.eval()
    with torch.no_grad():
        return compute_credit(
            whole["prompt_ids"], whole["completion_ids"], torch.tensor(whole["rewards"]),
            torch.arange(len(whole["rewards"])) // NUM_GENERATIONS, tokenizer=tokenizer, method=RUNS[method][0],
            method_params=RUNS[method][1], policy=policy_from_model(model, tokenizer, batch_size=16),
            gold_answers=whole["gold"], pred_answers=[benchmark.extract_answer(t) for t in whole["completions"]],
            answer_probe=benchmark.ANSWER_PROBE), whole


@pytest.mark.parametrize("method", RUN_NAMES)
def test_each_rank_trains_on_its_rows_of_the_whole_batch_credit(ranks, method):
    files = ranks[method]
    assert [f["world_size"] for f in files] == [WORLD, WORLD]
    assert files[0]["backend"] == "gloo"
    steps = len(files[0]["records"])
    assert steps == len(files[1]["records"]) == 2
    logged = [row for row in files[0]["log_history"] if "loss" in row and "reward" in row]
    assert len(logged) == steps  # TRL's own columns stay, one row per step

    for step in range(steps):
        batches = [f["records"][step] for f in files]
        for key, value in batches[0]["state"].items():  # DDP: the same weights on both ranks
            assert torch.equal(value, batches[1]["state"][key]), key
        result, whole = _whole_batch_credit(method, batches)
        groups = [whole["prompt_ids"][i: i + NUM_GENERATIONS] for i in range(0, WORLD * PER_RANK, NUM_GENERATIONS)]
        assert all(g.count(g[0]) == NUM_GENERATIONS for g in groups), "a group of rows holds several prompts"
        assert len({tuple(g[0]) for g in groups}) > 1  # not one prompt everywhere: the order is tested

        for rank, batch in enumerate(batches):
            used, mask = batch["advantages"], batch["completion_mask"].bool()
            assert used.shape == mask.shape  # (B, T): per token, this rank's B rows
            expected = result.token_advantages[rank * PER_RANK: (rank + 1) * PER_RANK]
            width = min(used.shape[1], expected.shape[1])
            torch.testing.assert_close(used[:, :width], expected[:, :width], rtol=1e-5, atol=1e-6)
            assert not used[:, width:].any() and not expected[:, width:].any()
            if method == "grpo":  # TRL's own advantages of the same batch, under DDP
                trl = batch["trl_advantages"][:, None].expand_as(mask)
                torch.testing.assert_close(used[mask], trl[mask], rtol=1e-5, atol=1e-6)
                assert not used[~mask].any()
        straddling = result.token_advantages[PER_RANK - 2: PER_RANK + 2]  # rows 4-7: group 1
        assert straddling.abs().amax() > 0.1  # the straddling group carries a real advantage

        row = logged[step]
        stats = credit_statistics(result)
        assert stats and stats.keys() <= {k.removeprefix("credit/") for k in row if k.startswith("credit/")}
        for name, value in stats.items():
            assert math.isclose(row[f"credit/{name}"], value, rel_tol=1e-5, abs_tol=1e-6), (method, step, name)
