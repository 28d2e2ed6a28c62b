"""The rivals of issue 30: high-entropy minority tokens (arXiv 2506.01939) and GRPO-VPS (arXiv
2604.20659) on hand-computed tensors, the loss's token selection, and `rredcot train` for each
(the batching options of arXiv 2605.08666 are tested in tests/train/test_batching.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from batches import batch_from_segments
from rredcot_cli.config.compose import compose
from rredcot_cli.methods import get_method
from rredcot_cli.methods.grpo_vps import segment_progress, vps_credit
from rredcot_cli.methods.high_entropy import high_entropy_mask
from rredcot_cli.train.loss import LossSettings, policy_loss

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAN = float("nan")


def close(actual, expected, atol=1e-5):
    return bool(torch.allclose(actual.to(torch.float64), torch.tensor(expected, dtype=torch.float64), atol=atol,
                               equal_nan=True))


# ------------------------------------------------------------------------------------------
# High-entropy minority tokens
# ------------------------------------------------------------------------------------------


def test_high_entropy_mask_matches_trl_example():
    """TRL's own test case: 10 valid tokens of entropies 0.1..1.0 (1.1 and 1.2 are padding); the
    0.8 quantile is 0.8 + 0.2 * 0.1 = 0.82 (linear interpolation at position 7.2), so the top 20%
    keeps the two tokens at 0.9 and 1.0."""
    entropies = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]).bool()
    got = high_entropy_mask(entropies, mask, 0.2)
    assert got.tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]]
    # top 50%: the median of 0.1..1.0 is 0.55, five tokens kept
    assert high_entropy_mask(entropies, mask, 0.5).tolist() == [[0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]]


def test_high_entropy_mask_edges():
    entropies = torch.tensor([[0.3, 0.3, 0.3], [0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]]).bool()
    assert high_entropy_mask(entropies, mask, 1.0).tolist() == [[1, 1, 1], [1, 0, 0]]  # quantile 0 = min
    assert high_entropy_mask(entropies, mask, 0.2).tolist() == [[1, 1, 1], [0, 0, 0]]  # ties all kept
    assert high_entropy_mask(entropies, torch.zeros_like(mask), 0.2).sum() == 0
    with pytest.raises(ValueError, match="top_quantile"):
        high_entropy_mask(entropies, mask, 0.0)


def test_token_weights_gate_the_policy_gradient_but_not_the_normaliser():
    """Ratio 1 (logp = old): L = -sum_t w_t A_t / N over all N = 4 completion tokens, so
    dL/dlogp_t = -w_t A_t / 4; the KL term is not gated."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]]).bool()
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, 0.0, 0.0]])
    w = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, LossSettings(clip_low=0.2, clip_high=0.2,
                          loss_agg="token-mean"), token_weights=w)
    assert math.isclose(float(loss.detach()), -(2 + 2 - 1) / 4, abs_tol=1e-6)
    loss.backward()
    assert close(logp.grad, [[-0.5, 0.0, -0.5], [0.25, 0.0, 0.0]])
    ref = logp.detach() + 0.1
    loss_kl, _ = policy_loss(logp.detach(), logp.detach(), adv, mask, LossSettings(clip_low=0.2, clip_high=0.2,
                             loss_agg="token-mean", kl_coef=1.0, kl_estimator="k1"),
                             token_weights=torch.zeros_like(w), ref_logprobs=ref)
    assert math.isclose(float(loss_kl), -0.1, abs_tol=1e-6)  # k1 = logp - ref = -0.1 on every token


def test_high_entropy_credit_is_grpo_and_selects_in_the_loss():
    batch = batch_from_segments([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0], [[2, 1], [3], [1, 1], [2]], padding=1)
    spec = get_method("high_entropy")
    credit = spec.fn(batch, top_quantile=0.2, scale_by_std=True, eps=1e-6)
    grpo = get_method("grpo").fn(batch, scale_by_std=True, eps=1e-6)
    assert torch.equal(credit.token_advantages, grpo.token_advantages)
    select = spec.token_selection({"top_quantile": 0.5, "scale_by_std": True, "eps": 1e-6})
    assert select(torch.tensor([[0.1, 0.9, 0.5, 0.2]]), torch.ones(1, 4, dtype=torch.bool)).tolist() == [[0, 1, 1, 0]]
    assert get_method("grpo").token_selection({}) is None


def test_an_update_whose_selection_keeps_nothing_moves_no_weight():
    """The selection reaches every forward of the update: keeping no token leaves the loss 0 and
    (AdamW without weight decay, zero gradients) the weights exactly as they were; keeping all
    equals the plain update."""
    from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model
    from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update

    tok = build_char_tokenizer()
    prompts = [tok(t)["input_ids"] for t in ["3+4\n", "ab\n", "7*2\n"]]
    completions = [tok(t)["input_ids"] for t in ["7", "ok ok", "14 no"]]
    T = max(len(c) for c in completions)
    adv = torch.tensor([[1.0] * T, [-1.0] * T, [0.5] * T])
    for i, c in enumerate(completions):
        adv[i, len(c):] = 0

    def run(selection):
        torch.manual_seed(0)
        model = build_tiny_model(len(tok), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32).eval()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        before = [p.detach().clone() for p in model.parameters()]
        policy_update(model, opt, sched, UpdateBatch(prompts, completions, adv, 0),
                      UpdateHyper(updates_per_batch=1, minibatch_size=3, loss=LossSettings(clip_low=0.2,
                                  clip_high=0.2, loss_agg="token-mean", max_tokens=8), token_selection=selection),
                      UpdateEngine(generator=torch.Generator().manual_seed(0)))
        return before, [p.detach().clone() for p in model.parameters()]

    before, after = run(lambda e, m: torch.zeros(e.shape))
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    _, plain = run(None)
    _, all_kept = run(lambda e, m: m.float())
    assert all(torch.equal(a, b) for a, b in zip(plain, all_kept))
    assert not all(torch.equal(a, b) for a, b in zip(before, plain))


# ------------------------------------------------------------------------------------------
# GRPO-VPS
# ------------------------------------------------------------------------------------------


def test_segment_progress_hand_computed():
    probs = torch.tensor([[0.1, 0.3, 0.2, NAN], [0.5, NAN, NAN, NAN]])
    K = torch.tensor([3, 1])
    # row 0: d = 0.3-0.1, 0.2-0.3, final segment 0; row 1: one segment, its final one -> 0
    assert close(segment_progress(probs, K), [[0.2, -0.1, 0.0], [0.0, NAN, NAN]])


def test_vps_reweight_hand_computed():
    """One group, two completions of two segments (1 token each) and rewards 1, 0: A = +-0.5 /
    sqrt(0.5) = +-0.7071 (unbiased std of {1, 0}). Progress d: [0.4, 0] and [-0.2, 0];
    rho = sign(A) d = [0.4, 0], [0.2, 0]; over the group's 4 segments mean 0.15, unbiased std
    sqrt(0.11/3) = 0.191485, z = [1.30558, -0.78335], [0.26112, -0.78335]; w~ = clip(1 + z, 0.1,
    3) = [2.30558, 0.21665], [1.26112, 0.21665]; mean one per row: [1.82816, 0.17184],
    [1.70678, 0.29322]."""
    batch = batch_from_segments([1.0, 0.0], [0, 0], [[1, 1], [1, 1]])
    probs = torch.tensor([[0.1, 0.5, NAN], [0.6, 0.4, NAN]])
    credit = vps_credit(probs, batch, refine="reweight", beta=1.0, w_min=0.1, w_max=3.0, lam=1.0, eps=0.0)
    a = 0.5 / math.sqrt(0.5)  # GRPO: r - mean = +-0.5, unbiased std sqrt(0.5), eps 0
    assert close(credit.token_advantages, [[a * 1.82816, a * 0.17184], [-a * 1.70678, -a * 0.29322]], atol=1e-4)
    assert close(credit.segment_credits, [[0.4, 0.0], [-0.2, 0.0]])
    assert close(credit.segment_values, [[0.5, 1.0], [0.4, 0.0]])  # p_1, then the reward


def test_vps_add_hand_computed_and_all_equal_group():
    batch = batch_from_segments([1.0, 0.0], [0, 0], [[1, 1], [1, 1]])
    probs = torch.tensor([[0.1, 0.5, NAN], [0.6, 0.4, NAN]])
    credit = vps_credit(probs, batch, refine="add", beta=1.0, w_min=0.1, w_max=3.0, lam=0.5, eps=0.0)
    # d over the group's segments: 0.4, 0, -0.2, 0 -> mean 0.05, std sqrt(0.19/3) = 0.251661
    z = [[(0.4 - 0.05) / 0.251661, -0.05 / 0.251661], [(-0.2 - 0.05) / 0.251661, -0.05 / 0.251661]]
    a = 0.5 / math.sqrt(0.5)
    expected = [[a + 0.5 * z[0][0], a + 0.5 * z[0][1]], [-a + 0.5 * z[1][0], -a + 0.5 * z[1][1]]]
    assert close(credit.token_advantages, expected, atol=1e-4)
    # all rewards equal: GRPO's A = 0, so reweight gives exactly 0 everywhere
    same = batch_from_segments([1.0, 1.0], [0, 0], [[1, 1], [1, 1]], padding=1)
    zero = vps_credit(probs, same, refine="reweight", beta=1.0, w_min=0.1, w_max=3.0, lam=1.0, eps=1e-6)
    assert torch.equal(zero.token_advantages, torch.zeros(2, 3))


@pytest.mark.parametrize("name", ["high_entropy", "grpo_vps"])
def test_presets_match_the_params(name):
    cfg = compose([f"method={name}"])
    assert dict(cfg.method) == {"name": name, **get_method(name).params().__dict__}


def test_grpo_cancel_preset_sets_the_batching_options():
    cfg = compose(["experiment=grpo_cancel"])
    assert cfg.method.name == "grpo"
    assert cfg.train.query_preserved_minibatches and cfg.train.reward_balanced_minibatches


SMALL = ["benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=32",
         "train.steps=2", "train.prompts_per_step=2", "train.minibatch_size=8", "train.eval_every=0",
         "train.eval_problems=2", "train.eval_samples=2"]


@pytest.mark.parametrize("choice", ["method=high_entropy", "method=grpo_vps", "experiment=grpo_cancel"])
def test_train_runs_two_steps(tmp_path, choice):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", f"run.dir={run}", choice, *SMALL],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = pq.read_table(run / "train/metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1, 2] and all(math.isfinite(m["loss"]) for m in metrics)


def test_selected_credit_is_what_the_update_trains_on():
    """The judge's view of a loss-side selection: token advantages x the 0/1 selection, segment
    credits = mean token advantage per segment. Two completions (A = +-0.7071), segments of 2 + 1
    and 3 tokens; top 50% of the 6 entropies (median 0.35) keeps 0.4, 0.9, 0.5."""
    from rredcot_cli.pipeline import selected_credit

    batch = batch_from_segments([1.0, 0.0], [0, 0], [[2, 1], [3]])
    spec = get_method("high_entropy")
    params = {"top_quantile": 0.5, "scale_by_std": True, "eps": 1e-6}
    credit = spec.fn(batch, **params)
    entropies = torch.tensor([[0.1, 0.4, 0.9], [0.3, 0.2, 0.5]])
    got = selected_credit(credit, batch, spec.token_selection(params), entropies)
    a = float(credit.token_advantages[0, 0])
    assert close(got.token_advantages, [[0.0, a, a], [0.0, 0.0, -a]])
    assert close(got.segment_credits, [[a / 2, a], [-a / 3, NAN]])


def test_judge_runs_both_credit_rivals(tmp_path):
    """`rredcot judge` on both: grpo_vps with its probe values, high_entropy on the credit its
    loss would train on (GRPO's advantage on the selected tokens: segments differ)."""
    run = tmp_path / "runs" / "entropy-and-vps"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    small = SMALL[:4]
    for args in (["sample", "sample.num_prompts=2"], ["segment"],
                 ["judge", "judge.methods=[grpo,high_entropy,grpo_vps]", "judge.reference_k=2", "judge.reruns=1"]):
        result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args[:1], f"run.dir={run}", *small, *args[1:]],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
    rows = pq.read_table(run / "judge/credit_quality.parquet").to_pylist()
    assert [r["method"] for r in rows] == ["grpo", "high_entropy", "grpo_vps", "control:outcome", "control:baseline"]
    grpo, high, vps = rows[:3]
    assert grpo["credit_constant"] and not high["credit_constant"]
    assert vps["value_spearman"] is not None and grpo["value_spearman"] is None
