"""CSCR, SC-GRPO and CoRT: weight formulas on hand-computed tensors, then each method on the
embedded tiny model through the path `rredcot attribute` takes, presets, and a short training run."""

import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from batches import run_method

from rredcot_cli.config.compose import compose
from rredcot_cli.methods import get_method
from rredcot_cli.methods._token_weights import reweighted_credit
from rredcot_cli.methods.base import CreditBatch
from rredcot_cli.methods.cort import cort_weights, remove_block
from rredcot_cli.methods.cscr import cscr_weights
from rredcot_cli.methods.sc_grpo import sc_grpo_weights, token_kl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALL = torch.ones(1, 3, dtype=torch.bool)


def normalised(values):
    """values * n / sum(values): the mean-one rescaling, by hand."""
    return [v * len(values) / sum(values) for v in values]


def close(actual, expected, atol=1e-4):
    return torch.allclose(actual, torch.tensor(expected, dtype=torch.float32), atol=atol)


# ------------------------------------------------------------------------------------------
# Shared credit assembly
# ------------------------------------------------------------------------------------------


def test_reweighted_credit_keeps_budget_and_averages_segments():
    # Row 0: 3 tokens in segments (0, 0, 1); row 1: 2 tokens in segments (0, 1) + padding.
    seg = torch.tensor([[0, 0, 1], [0, 1, -1]])
    batch = CreditBatch(rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]), segment_ids=seg,
                        num_segments=torch.tensor([2, 2]))
    weights = torch.tensor([[0.5, 1.0, 1.5], [1.5, 0.5, 7.0]])  # 7.0 sits on padding
    credit = reweighted_credit(torch.tensor([2.0, -1.0]), weights, batch)
    assert close(credit.token_advantages, [[1.0, 2.0, 3.0], [-1.5, -0.5, 0.0]])
    assert credit.token_advantages[1, 2].item() == 0.0
    assert close(credit.segment_credits, [[1.5, 3.0], [-1.5, -0.5]])
    assert torch.isnan(credit.segment_values).all()


# ------------------------------------------------------------------------------------------
# CSCR
# ------------------------------------------------------------------------------------------

D_POS = torch.tensor([[0.2, -0.4, 0.0]])
D_NEG = torch.tensor([[0.2, -0.2, 0.0]])


def test_cscr_weights_hand_computed():
    # s = (|D+| + |D-|) / 2 = (0.2, 0.3, 0), mean 1/6 -> s^ = (1.2, 1.8, 0);
    # down-weighting: 1 / (1 + s^) = (1/2.2, 1/2.8, 1), then mean one.
    w = cscr_weights(D_POS, D_NEG, ALL, alpha=1.0, w_min=0.1, w_max=3.0)
    expected = normalised([1 / 2.2, 1 / 2.8, 1.0])
    assert close(w[0], expected)
    assert w.mean().item() == pytest.approx(1.0, abs=1e-6)
    # The most sensitive token (index 1) gets the least credit.
    assert int(w[0].argmin()) == 1
    # w_max = 1.5 binds on token 2: clip, then rescale to mean one once more.
    clipped = cscr_weights(D_POS, D_NEG, ALL, alpha=1.0, w_min=0.1, w_max=1.5)
    assert close(clipped[0], normalised([expected[0], expected[1], 1.5]))
    # The ablation direction up-weights sensitive tokens: 1 + s^ = (2.2, 2.8, 1).
    up = cscr_weights(D_POS, D_NEG, ALL, alpha=1.0, w_min=0.1, w_max=3.0, weight_direction="up")
    assert close(up[0], [1.1, 1.4, 0.5])
    # max sensitivity: s = (0.2, 0.4, 0), mean 0.2 -> s^ = (1, 2, 0).
    mx = cscr_weights(D_POS, D_NEG, ALL, alpha=1.0, w_min=0.1, w_max=3.0, sensitivity="max")
    assert close(mx[0], normalised([0.5, 1 / 3, 1.0]))


def test_cscr_weights_padding_and_validation():
    mask = torch.tensor([[True, True, False]])
    w = cscr_weights(torch.tensor([[0.5, 0.0, 9.0]]), torch.tensor([[0.5, 0.0, 9.0]]), mask, alpha=1.0, w_min=0.1,
                     w_max=3.0)
    # s = (0.5, 0) -> s^ = (2, 0) -> (1/3, 1) -> mean one over the two real tokens.
    assert close(w[0, :2], normalised([1 / 3, 1.0])) and w[0, 2].item() == 0.0
    with pytest.raises(ValueError, match="sensitivity"):
        cscr_weights(D_POS, D_NEG, ALL, alpha=1.0, w_min=0.1, w_max=3.0, sensitivity="median")
    with pytest.raises(ValueError, match="w_min <= 1 <= w_max"):
        cscr_weights(D_POS, D_NEG, ALL, alpha=1.0, w_min=0.1, w_max=0.9)


# ------------------------------------------------------------------------------------------
# SC-GRPO
# ------------------------------------------------------------------------------------------


def test_token_kl_hand_computed():
    student = torch.tensor([0.5, 0.5]).log()
    teacher = torch.tensor([0.8, 0.2]).log()
    rev = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)  # KL(student || teacher)
    fwd = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)  # KL(teacher || student)
    assert token_kl(student, teacher, "rev").item() == pytest.approx(rev, abs=1e-6)
    assert token_kl(student, teacher, "fwd").item() == pytest.approx(fwd, abs=1e-6)
    # Top-2 of the teacher's three tokens, both renormalised there: (5/8, 3/8) vs (2/3, 1/3).
    s3, t3 = torch.tensor([0.5, 0.3, 0.2]).log(), torch.tensor([0.6, 0.3, 0.1]).log()
    top2 = 0.625 * math.log(0.625 / (2 / 3)) + 0.375 * math.log(0.375 / (1 / 3))
    assert token_kl(s3, t3, "rev", top_k=2).item() == pytest.approx(top2, abs=1e-6)
    assert token_kl(s3, t3, "rev", top_k=1).item() == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match="kl_dir"):
        token_kl(student, teacher, "both")


def test_sc_grpo_weights_hand_computed():
    mask = torch.ones(1, 4, dtype=torch.bool)
    kl = torch.tensor([[0.1, 0.3, 0.0, 0.4]])
    # KL / mean KL = (0.5, 1.5, 0, 2), clipped to [0.2, 1.8] = (0.5, 1.5, 0.2, 1.8): already mean one.
    assert close(sc_grpo_weights(kl, mask, w_min=0.2, w_max=1.8)[0], [0.5, 1.5, 0.2, 1.8])
    # gamma 2: KL^2 / mean = (2/13, 18/13, 0, 32/13), clip low at 0.2, then mean one.
    w2 = sc_grpo_weights(kl, mask, w_min=0.2, w_max=5.0, gamma=2.0)
    assert close(w2[0], normalised([0.2, 18 / 13, 0.2, 32 / 13]))
    # No KL anywhere: uniform weights; padding exactly 0.
    pad_mask = torch.tensor([[True, True, True, False]])
    flat = sc_grpo_weights(torch.tensor([[0.0, 0.0, 0.0, 5.0]]), pad_mask, w_min=0.2, w_max=5.0)
    assert close(flat[0, :3], [1.0, 1.0, 1.0]) and flat[0, 3].item() == 0.0


# ------------------------------------------------------------------------------------------
# CoRT
# ------------------------------------------------------------------------------------------


def test_cort_weights_hand_computed():
    c = torch.tensor([[1.0, 2.0, 3.0]])
    z = 1 / math.sqrt(2 / 3)  # standardised contrasts are (-z, 0, z), population std
    lo, hi = 1 - 0.5 * math.tanh(z), 1 + 0.5 * math.tanh(z)
    pos, neg = torch.tensor([1.0]), torch.tensor([-1.0])
    # Symmetric around 1, so already mean one.
    assert close(cort_weights(c, ALL, pos, lam=0.5)[0], [lo, 1.0, hi])
    # flip_negative mirrors the weights of a completion with a negative advantage only.
    assert close(cort_weights(c, ALL, neg, lam=0.5, flip_negative=True)[0], [hi, 1.0, lo])
    assert close(cort_weights(c, ALL, pos, lam=0.5, flip_negative=True)[0], [lo, 1.0, hi])
    # |z| ablation: (hi, 1, hi), then mean one.
    assert close(cort_weights(c, ALL, pos, lam=0.5, mode="abs")[0], normalised([hi, 1.0, hi]))
    # A constant contrast carries no information: weights 1; padding exactly 0.
    mask = torch.tensor([[True, True, False]])
    flat = cort_weights(torch.tensor([[0.7, 0.7, 4.0]]), mask, pos, lam=0.5)
    assert close(flat[0, :2], [1.0, 1.0]) and flat[0, 2].item() == 0.0
    with pytest.raises(ValueError, match="lam < 1"):
        cort_weights(c, ALL, pos, lam=1.0)


def test_remove_block_takes_the_first_listed_block_once():
    assert remove_block("Compute mod 10: 5 +3\n", ["Find", "Compute mod 10:"]) == " 5 +3\n"
    assert remove_block("ab ab", ["ab"]) == " ab"
    assert remove_block("Compute mod 10: 5", ["Find the first x in"]) is None


# ------------------------------------------------------------------------------------------
# On the embedded tiny model, through credit_batch -> attribute -> credit_rows
# ------------------------------------------------------------------------------------------


def check_reweighting(batch, credit):
    """Weights keep each completion's GRPO sign and total (mean-one weights), are not all 1,
    and padding gets exactly 0."""
    grpo = get_method("grpo").fn(batch, scale_by_std=True, eps=1e-6).token_advantages
    mask = batch.token_mask
    adv = credit.token_advantages
    assert torch.all(adv[~mask] == 0)
    assert torch.all(torch.sign(adv[mask]) == torch.sign(grpo[mask]))
    assert torch.allclose(adv.sum(1), grpo.sum(1), rtol=1e-4, atol=1e-4)
    weights = adv[mask] / grpo[mask]
    assert weights.std() > 0.01, "the model's scores should move the weights away from 1"


def test_cscr_on_tiny_model(tiny_chain):
    batch, credit = run_method(tiny_chain, "cscr")
    check_reweighting(batch, credit)
    fraction = batch.extras["value_stats"]["cscr_same_sign_fraction"]
    assert 0.0 <= fraction <= 1.0
    # The answer-hint variant takes its wrong answer from the failed completions of the group.
    batch, credit = run_method(tiny_chain, "cscr", condition="answer_hint")
    check_reweighting(batch, credit)


def test_sc_grpo_on_tiny_model(tiny_chain):
    batch, credit = run_method(tiny_chain, "sc_grpo")
    check_reweighting(batch, credit)
    # Each gold completion is conditioned on the other (identical) one: the teacher has seen
    # every token, so the conditioned distribution moves and the weights are not flat.
    gold_row = credit.token_advantages[0, batch.token_mask[0]]
    assert gold_row.std() > 0
    top = run_method(tiny_chain, "sc_grpo", top_k=8, kl_dir="fwd", batch_size=1, kl_chunk=5)[1]
    assert torch.all(top.token_advantages[~batch.token_mask] == 0)


def test_cort_on_tiny_model(tiny_chain):
    batch, credit = run_method(tiny_chain, "cort")
    check_reweighting(batch, credit)
    # Without a block to remove, CoRT refuses, or (skip) gives exactly the GRPO advantage.
    with pytest.raises(ValueError, match="none of method.blocks"):
        run_method(tiny_chain, "cort", blocks=["no such instruction"])
    _, skipped = run_method(tiny_chain, "cort", blocks=["no such instruction"], missing_block="skip")
    grpo = get_method("grpo").fn(batch, scale_by_std=True, eps=1e-6)
    assert torch.equal(skipped.token_advantages, grpo.token_advantages)


def test_uniform_groups_are_not_scored(tiny_chain):
    """All-correct groups have advantage 0: nothing is rescored (no forward tokens counted)."""
    from rredcot_cli.pipeline import attribute

    policy, _, make_batch = tiny_chain
    batch = make_batch()
    batch.rewards = torch.ones_like(batch.rewards)
    for name in ("cscr", "sc_grpo", "cort"):
        batch.extras.pop("value_stats", None)
        credit = attribute(get_method(name), batch, get_method(name).params().__dict__, {"policy": policy})
        assert torch.all(credit.token_advantages == 0)
        assert batch.extras.get("value_stats", {}).get("forward_tokens", 0) == 0


# ------------------------------------------------------------------------------------------
# Presets and a short training run
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cscr", "sc_grpo", "cort"])
def test_presets_compose_to_the_declared_defaults(name):
    cfg = compose([f"method={name}"])
    assert dict(cfg.method) == {"name": name, **get_method(name).params().__dict__}


def test_train_sc_grpo_runs_one_step(tmp_path):
    run = tmp_path / "runs" / "sc_grpo"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    args = ["train", f"run.dir={run}", "method=sc_grpo", "benchmark.min_steps=2", "benchmark.max_steps=3",
            "sampling.n=4", "sampling.max_new_tokens=32", "train.steps=1", "train.prompts_per_step=2",
            "train.minibatch_size=8", "train.eval_every=0", "train.eval_problems=2", "train.eval_samples=2"]
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = pq.read_table(run / "train/metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1] and math.isfinite(metrics[0]["loss"])
