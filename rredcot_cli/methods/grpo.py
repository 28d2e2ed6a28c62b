"""GRPO outcome advantage (Shao et al., 2024, "DeepSeekMath", arXiv 2402.03300, section 4.1.2).

Every token of completion i gets A_i = (r_i - mean(r_group)) / (std(r_group) + eps).
The std is the unbiased (Bessel) one and a group of size 1 gets mean 0 and std 1, as in verl's
``compute_grpo_outcome_advantage``, so results match the most used open implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, broadcast_sequence_advantage


@dataclass
class GRPOParams:
    # Divide by the group's reward std (GRPO); False gives Dr. GRPO's advantage.
    scale_by_std: bool = True
    eps: float = 1e-6


# Meaningful range of each numeric parameter (checked when the config is composed).
GRPO_RANGES = {
    "eps": "> 0",
}


def group_mean_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-completion mean and unbiased std of its group's rewards.

    rewards: (B,) float, group_ids: (B,) int64 -> (mean (B,), std (B,)); groups of one
    completion get mean 0 and std 1.
    """
    rewards = rewards.to(torch.float32)
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.shape[0]).index_add_(0, inverse, rewards)
    means = sums / counts
    sq_dev = torch.zeros(counts.shape[0]).index_add_(0, inverse, (rewards - means[inverse]) ** 2)
    stds = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))
    single = counts == 1
    means = torch.where(single, torch.zeros_like(means), means)
    stds = torch.where(single, torch.ones_like(stds), stds)
    return means[inverse], stds[inverse]


def grpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool, eps: float) -> torch.Tensor:
    """(B,) rewards -> (B,) group-normalised outcome advantages."""
    mean, std = group_mean_std(rewards, group_ids)
    advantage = rewards.to(torch.float32) - mean
    return advantage / (std + eps) if scale_by_std else advantage


@register("grpo", params=GRPOParams, ranges=GRPO_RANGES)
def grpo(batch: CreditBatch, *, scale_by_std: bool = True, eps: float = 1e-6) -> Credit:
    """Outcome advantage broadcast to all tokens and segments; no state values."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    return broadcast_sequence_advantage(advantage, batch)
