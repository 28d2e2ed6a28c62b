"""Hand-computed values of the clipped policy loss, its aggregations and KL estimators."""

import math
from dataclasses import replace

import pytest
import torch

from rredcot_cli.train.loss import LossSettings, aggregate, kl_estimate, policy_loss


def test_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert aggregate(per_token, mask, "token-mean") == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean") == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(per_token, mask, "constant", max_tokens=5) == pytest.approx(10 / (2 * 5))
    with pytest.raises(ValueError, match="valid"):
        aggregate(per_token, mask, "nope")


def test_clipped_surrogate_by_hand():
    old = torch.zeros(1, 4)
    # ratios: 1.5 (A>0, clipped to 1.2), 0.5 (A>0, unclipped: min picks 0.5), 1.5 (A<0: min picks
    # -1.5, unclipped), 0.5 (A<0, clipped to 0.8 -> -0.8 is smaller than -0.5)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, stats = policy_loss(new, old, adv, mask, LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean"))
    expected = -(1.2 + 0.5 - 1.5 - 0.8) / 4
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(0.5)


def test_clip_higher_is_asymmetric():
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[1.25]]))
    adv = torch.ones(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss_sym, _ = policy_loss(new, old, adv, mask, LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean"))
    loss_dapo, _ = policy_loss(new, old, adv, mask, LossSettings(clip_low=0.2, clip_high=0.28, loss_agg="token-mean"))
    assert float(loss_sym) == pytest.approx(-1.2)
    assert float(loss_dapo) == pytest.approx(-1.25)


def test_gradient_is_advantage_at_ratio_one():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(1, 2, dtype=torch.bool), LossSettings(clip_low=0.2,
                          clip_high=0.2, loss_agg="token-mean"))
    loss.backward()
    # d/dlogp of -ratio*A at ratio 1 is -A, divided by 2 tokens.
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.5]]))


def test_padding_does_not_contribute():
    logp = torch.tensor([[-1.0, 5.0]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.tensor([[-1.0, 0.0]]), torch.tensor([[1.0, 100.0]]), torch.tensor([[True,
                          False]]), LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean"))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logp.grad[0, 1] == 0


def test_kl_estimators_by_hand():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    x = math.log(2.0)
    assert float(kl_estimate(logp, ref, "k1")) == pytest.approx(x)
    assert float(kl_estimate(logp, ref, "k3")) == pytest.approx(math.exp(-x) + x - 1)
    assert float(kl_estimate(ref, ref, "k3")) == 0.0


def test_kl_term_added_to_loss():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, stats = policy_loss(logp, logp, torch.zeros(1, 1), mask, LossSettings(clip_low=0.2, clip_high=0.2,
                              loss_agg="token-mean", kl_coef=0.1, kl_estimator="k1"), ref_logprobs=ref)
    assert float(loss) == pytest.approx(0.1 * math.log(2.0))
    assert stats.kl_ref == pytest.approx(math.log(2.0))


def test_micro_batch_losses_sum_to_the_minibatch_loss():
    from rredcot_cli.train.loss import loss_normalizer

    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "constant"):
        whole = aggregate(per_token, mask, mode, max_tokens=4)
        norm = loss_normalizer(mask, mode, max_tokens=4)
        parts = sum(aggregate(per_token[i : i + 1], mask[i : i + 1], mode, 4, normalizer=norm) for i in range(3))
        assert float(parts) == pytest.approx(float(whole), abs=1e-6), mode
    assert loss_normalizer(mask, "token-mean") == 6 and loss_normalizer(mask, "seq-mean-token-mean") == 3
    assert loss_normalizer(mask, "constant", max_tokens=4) == 12


def test_sampler_correction_weights_by_hand():
    from rredcot_cli.train.loss import sampler_correction_weights

    # log rho per token: row 0: log 3, log 0.5, padding; row 1: log 1.5, log 1.5
    old = torch.log(torch.tensor([[0.6, 0.1, 0.9], [0.3, 0.3, 0.5]]))
    sampler = torch.log(torch.tensor([[0.2, 0.2, 0.1], [0.2, 0.2, 0.5]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    w = lambda mode: sampler_correction_weights(old, sampler, mask, mode, cap=2.0)  # noqa: E731
    assert torch.allclose(w("none"), mask.float())
    assert torch.allclose(w("token_truncate"), torch.tensor([[2.0, 0.5, 0.0], [1.5, 1.5, 0.0]]))
    assert torch.allclose(w("token_mask"), torch.tensor([[0.0, 0.5, 0.0], [1.5, 1.5, 0.0]]))
    # sequence rho: row 0: 3 * 0.5 = 1.5; row 1: 1.5 * 1.5 = 2.25
    assert torch.allclose(w("sequence_truncate"), torch.tensor([[1.5, 1.5, 0.0], [2.0, 2.0, 0.0]]))
    assert torch.allclose(w("sequence_mask"), torch.tensor([[1.5, 1.5, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="valid"):
        w("tis")


def test_sampler_weights_scale_the_policy_gradient_term_only():
    old = torch.zeros(1, 2)
    new = torch.zeros(1, 2, requires_grad=True)
    adv = torch.tensor([[1.0, -2.0]])
    ref = torch.full((1, 2), -0.5)
    mask = torch.ones(1, 2, dtype=torch.bool)
    weights = torch.tensor([[2.0, 0.5]])
    loss, _ = policy_loss(new, old, adv, mask, LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean",
                          kl_coef=0.1, kl_estimator="k1"), ref_logprobs=ref, sampler_weights=weights)
    # ratio 1: pg term -A_t * w_t, KL (k1) = new - ref = 0.5 unweighted
    assert float(loss.detach()) == pytest.approx((-(1.0 * 2.0) + (2.0 * 0.5) + 2 * 0.1 * 0.5) / 2, abs=1e-6)


# ------------------------------------------------------------------------------------------
# Against verl (issue 30): the k3 clamp and the dual clip, options that are off by default
# ------------------------------------------------------------------------------------------


def test_k3_unclamped_by_default_and_verls_clamp_as_an_option():
    # log p = -15 against a reference at 0: k3 = e^15 - 15 - 1 (the 3.3e6).
    logp = torch.tensor([-15.0, -1.0, 0.0], requires_grad=True)
    ref = torch.tensor([0.0, 0.0, -30.0])
    default = kl_estimate(logp, ref, "k3")
    log_ratio = logp.detach() - ref
    assert torch.equal(default.detach(), torch.exp(-log_ratio) + log_ratio - 1.0)  # unchanged formula
    assert default[0].item() == pytest.approx(math.exp(15) - 16, rel=1e-6)
    clamped = kl_estimate(logp, ref, "k3", clamp=10.0)
    # Row 1: x = 1, e - 2 inside the clamp; row 2: x = -30 -> -20 -> e^-20 + 19 -> 10.
    assert clamped.tolist() == pytest.approx([10.0, math.e - 2, 10.0], abs=1e-6)
    clamped.sum().backward()
    # d k3 / d logp = 1 - e^x: 0 where clamped, 1 - e inside.
    assert logp.grad.tolist() == pytest.approx([0.0, 1 - math.e, 0.0], abs=1e-6)
    assert torch.equal(kl_estimate(logp, ref, "k1", clamp=10.0), logp - ref)  # k1 is never clamped
    with pytest.raises(ValueError, match=">= 0"):
        kl_estimate(logp, ref, "k3", clamp=-1.0)


def test_k3_clamp_reaches_the_loss():
    logp, ref = torch.tensor([[-15.0, -1.0]]), torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    settings = LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean", kl_coef=0.1)
    loss, stats = policy_loss(logp, logp, torch.zeros(1, 2), mask, replace(settings, kl_clamp=10.0), ref_logprobs=ref)
    assert float(loss) == pytest.approx(0.1 * (10 + math.e - 2) / 2, abs=1e-6)
    assert stats.kl_ref == pytest.approx((10 + math.e - 2) / 2, abs=1e-6)
    unclamped, _ = policy_loss(logp, logp, torch.zeros(1, 2), mask, settings, ref_logprobs=ref)
    assert float(unclamped) == pytest.approx(0.1 * (math.exp(15) - 16 + math.e - 2) / 2, rel=1e-6)


def test_dual_clip_by_hand():
    old = torch.zeros(1, 4)
    # ratio 4, A < 0: PPO's loss 4 is capped at c = 3; ratio 2, A < 0: 2 < 3 stays; A > 0 and
    # ratio 0.5 (A < 0, clipped to 0.8) are untouched.
    new = torch.log(torch.tensor([[4.0, 2.0, 4.0, 0.5]])).requires_grad_()
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    plain_settings = LossSettings(clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
    plain, _ = policy_loss(new, old, adv, mask, plain_settings)
    assert float(plain.detach()) == pytest.approx((4 + 2 - 1.2 + 0.8) / 4, abs=1e-6)
    dual, _ = policy_loss(new, old, adv, mask, replace(plain_settings, clip_ratio_c=3.0))
    assert float(dual.detach()) == pytest.approx((3 + 2 - 1.2 + 0.8) / 4, abs=1e-6)
    dual.backward()
    # The capped token has no gradient; the ratio-2 token keeps d(-r A)/dlogp = r = 2, over 4 tokens.
    assert new.grad[0].tolist() == pytest.approx([0.0, 0.5, 0.0, 0.0], abs=1e-6)
    off, _ = policy_loss(new, old, adv, mask, replace(plain_settings, clip_ratio_c=0.0))
    assert torch.equal(off, plain)
    with pytest.raises(ValueError, match="> 1"):
        policy_loss(new, old, adv, mask, replace(plain_settings, clip_ratio_c=1.0))


def test_dual_clip_equals_verls_formula_on_random_tokens():
    """verl's compute_policy_loss (core_algos.py), written out: pg1 = -A r, pg2 = -A clip(r),
    l1 = max(pg1, pg2), l2 = min(-A c, l1), loss = l2 where A < 0 else l1 (token-mean)."""
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(4, 9, generator=gen)
    new = old + 2 * torch.randn(4, 9, generator=gen)  # ratios from e^-6 to e^6
    adv = torch.randn(4, 9, generator=gen)
    mask = torch.rand(4, 9, generator=gen) > 0.2
    r = torch.exp(new - old)
    pg1, pg2 = -adv * r, -adv * torch.clamp(r, 0.8, 1.28)
    l1 = torch.maximum(pg1, pg2)
    per_token = torch.where(adv < 0, torch.minimum(-adv * 3.0, l1), l1)
    expected = (per_token * mask).sum() / mask.sum()
    loss, _ = policy_loss(new, old, adv, mask, LossSettings(clip_low=0.2, clip_high=0.28, loss_agg="token-mean",
                          clip_ratio_c=3.0))
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


def test_new_loss_options_default_off_and_are_checked():
    from rredcot_cli.config.compose import compose
    from rredcot_cli.errors import ConfigError
    from rredcot_cli.stages.train import update_hyper

    cfg = compose([])
    assert (cfg.train.kl_clamp, cfg.train.clip_ratio_c) == (0.0, 0.0)
    hyper = update_hyper(compose(["train.kl_clamp=10", "train.clip_ratio_c=3"]), "fp32")
    assert (hyper.loss.kl_clamp, hyper.loss.clip_ratio_c) == (10.0, 3.0)
    for bad in ("train.kl_clamp=-1", "train.clip_ratio_c=-1"):
        with pytest.raises(ConfigError, match=">= 0"):
            compose([bad])
