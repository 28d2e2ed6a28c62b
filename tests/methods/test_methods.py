"""Hand-computed advantages for the outcome-only methods."""

import math

import pytest
import torch

from rredcot_cli.methods import get_method, method_names
from rredcot_cli.methods.base import CreditBatch


def make_batch(rewards, groups, lengths, segments_per_completion):
    T = max(lengths)
    seg = torch.full((len(rewards), T), -1, dtype=torch.long)
    for i, (n, k) in enumerate(zip(lengths, segments_per_completion)):
        # Segment j covers an equal share of the tokens; exact split does not matter here.
        for t in range(n):
            seg[i, t] = min(k - 1, t * k // n)
    return CreditBatch(
        rewards=torch.tensor(rewards, dtype=torch.float32),
        group_ids=torch.tensor(groups),
        segment_ids=seg,
        num_segments=torch.tensor(segments_per_completion),
    )


def test_registry_lists_both_methods():
    assert {"grpo", "dr_grpo"} <= set(method_names())
    with pytest.raises(KeyError, match="valid: .*grpo"):
        get_method("nonexistent")


def test_grpo_hand_computed():
    # Group 0: rewards 1,0,0,1 -> mean 0.5, unbiased std sqrt(1/3); group 1: 1,0 -> mean 0.5,
    # std sqrt(0.5).
    batch = make_batch([1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1], [3, 2, 4, 1, 2, 3], [2, 1, 2, 1, 1, 3])
    credit = get_method("grpo").fn(batch, scale_by_std=True, eps=0.0)
    a0 = 0.5 / math.sqrt(1 / 3)
    a1 = 0.5 / math.sqrt(0.5)
    expected_seq = torch.tensor([a0, -a0, -a0, a0, a1, -a1])
    adv = credit.token_advantages
    assert adv.shape == (6, 4)
    for i, n in enumerate([3, 2, 4, 1, 2, 3]):
        assert torch.allclose(adv[i, :n], expected_seq[i].expand(n), atol=1e-6)
        assert torch.all(adv[i, n:] == 0)
    # Segment credits: the sequence advantage on existing segments, NaN beyond; no values.
    assert credit.segment_credits.shape == (6, 3)
    assert torch.isclose(credit.segment_credits[5, 2], torch.tensor(-a1))
    assert torch.isnan(credit.segment_credits[1, 1])
    assert torch.isnan(credit.segment_values).all()


def test_grpo_uniform_group_gives_zero_and_single_group_gets_raw_reward():
    batch = make_batch([1, 1, 1, 0.7], [0, 0, 0, 1], [2, 2, 2, 2], [1, 1, 1, 1])
    credit = get_method("grpo").fn(batch, scale_by_std=True, eps=1e-6)
    assert torch.all(credit.token_advantages[:3] == 0)
    # verl convention: a group of one has mean 0, std 1.
    assert torch.allclose(credit.token_advantages[3], torch.tensor([0.7, 0.7]), atol=1e-5)


def test_dr_grpo_hand_computed():
    batch = make_batch([1, 0, 0, 0], [0, 0, 0, 0], [2, 3, 1, 2], [1, 2, 1, 1])
    credit = get_method("dr_grpo").fn(batch)
    assert torch.allclose(credit.token_advantages[0, :2], torch.tensor([0.75, 0.75]))
    assert torch.allclose(credit.token_advantages[1], torch.tensor([-0.25, -0.25, -0.25]))
    assert credit.token_advantages[2, 1:].abs().sum() == 0
