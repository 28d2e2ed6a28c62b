"""GRPO outcome advantage (Shao et al., 2024, "DeepSeekMath", arXiv 2402.03300, section 4.1.2).

Every token of completion i gets A_i = (r_i - mean(r_group)) / (std(r_group) + eps).
The std is the unbiased (Bessel) one and a group of size 1 gets mean 0 and std 1, as in verl's
``compute_grpo_outcome_advantage``, so results match the most used open implementation (to
float32 rounding) for every group whose rewards are not all equal. Deviation: a group whose rewards are all
equal gets exactly 0 (``base.group_mean_std`` detects it); verl's float32 mean of such a group is
a few ulps off when the rewards are not binary or dyadic, and dividing by a std of the same size
gives it an O(1) advantage (issue 30).

TRL 1.16's ``GRPOTrainer`` (scale_rewards="group") gives the same advantage with eps=1e-4 (its
fixed eps; verl's 1e-6 is the default here), except a group of one (0 there: its
num_generations=1 path) and an all-equal inexact group (a residue of ulps / 1e-4 there); tested
against it in tests/methods/test_oracle_trl.py.

Shapes: rewards (B,), group_ids (B,) -> token advantages (B, T), exactly 0 on padding; segment
credits (B, S) = A_i on every existing segment; no state values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, broadcast_sequence_advantage, group_mean_std


@dataclass
class GRPOParams:
    # Divide by the group's reward std (GRPO); False gives Dr. GRPO's advantage.
    scale_by_std: bool = True
    eps: float = 1e-6  # added to the group's reward std


# Meaningful range of each numeric parameter (checked when the config is composed).
GRPO_RANGES = {
    "eps": "> 0",
}


def grpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool, eps: float) -> torch.Tensor:
    """(B,) rewards, (B,) group ids -> (B,) group-normalised outcome advantages; exactly 0 for
    every row of a group whose rewards are all equal (and 2+ rows)."""
    mean, std = group_mean_std(rewards, group_ids)
    advantage = rewards.to(torch.float32) - mean
    return advantage / (std + eps) if scale_by_std else advantage


@register("grpo", params=GRPOParams, ranges=GRPO_RANGES)
def grpo(batch: CreditBatch, *, scale_by_std: bool = True, eps: float = 1e-6) -> Credit:
    """Outcome advantage broadcast to all tokens and segments; no state values."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    return broadcast_sequence_advantage(advantage, batch)
