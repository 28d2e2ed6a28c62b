"""Hand-computed values of the clipped policy loss, its aggregations and KL estimators."""

import math

import pytest
import torch

from rredcot_cli.loss import aggregate, kl_estimate, policy_loss


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
    loss, stats = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
    expected = -(1.2 + 0.5 - 1.5 - 0.8) / 4
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(0.5)


def test_clip_higher_is_asymmetric():
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[1.25]]))
    adv = torch.ones(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss_sym, _ = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
    loss_dapo, _ = policy_loss(new, old, adv, mask, clip_low=0.2, clip_high=0.28, loss_agg="token-mean")
    assert float(loss_sym) == pytest.approx(-1.2)
    assert float(loss_dapo) == pytest.approx(-1.25)


def test_gradient_is_advantage_at_ratio_one():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0]])
    loss, _ = policy_loss(logp, logp.detach(), adv, torch.ones(1, 2, dtype=torch.bool),
                          clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
    loss.backward()
    # d/dlogp of -ratio*A at ratio 1 is -A, divided by 2 tokens.
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.5]]))


def test_padding_does_not_contribute():
    logp = torch.tensor([[-1.0, 5.0]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.tensor([[-1.0, 0.0]]), torch.tensor([[1.0, 100.0]]),
                          torch.tensor([[True, False]]), clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
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
    loss, stats = policy_loss(logp, logp, torch.zeros(1, 1), mask, clip_low=0.2, clip_high=0.2,
                              loss_agg="token-mean", ref_logprobs=ref, kl_coef=0.1, kl_estimator="k1")
    assert float(loss) == pytest.approx(0.1 * math.log(2.0))
    assert stats.kl_ref == pytest.approx(math.log(2.0))
