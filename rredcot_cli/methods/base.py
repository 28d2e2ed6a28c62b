"""Inputs and outputs of a credit-assignment method.

A method is a pure function ``fn(batch: CreditBatch, **params) -> Credit`` registered under a
name. Completions of one prompt form a group (``group_ids``); tokens of a completion are split
into segments (``segment_ids``). Padding positions carry ``segment_ids == -1`` and must receive an
advantage of exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class CreditBatch:
    rewards: torch.Tensor  # (B,) float32 verified reward per completion; unscorable -> 0
    group_ids: torch.Tensor  # (B,) int64, completions of the same prompt share an id
    segment_ids: torch.Tensor  # (B, T) int64, segment index of each token, -1 on padding
    num_segments: torch.Tensor  # (B,) int64, K_i >= 1
    # Model-based methods get these too (None otherwise).
    prompt_token_ids: list[list[int]] | None = None
    completion_token_ids: list[list[int]] | None = None
    old_logprobs: torch.Tensor | None = None  # (B, T) float32, 0 on padding
    extras: dict[str, Any] | None = None  # per-batch side information (e.g. gold answers)

    @property
    def token_mask(self) -> torch.Tensor:
        """(B, T) bool, True on completion tokens."""
        return self.segment_ids >= 0

    @property
    def max_segments(self) -> int:
        return int(self.num_segments.max().item()) if self.num_segments.numel() else 0


@dataclass
class Credit:
    token_advantages: torch.Tensor  # (B, T) float32, exactly 0 on padding
    # (B, S) float32 with S = batch.max_segments; NaN where a segment does not exist or the
    # method has no such quantity (values for outcome-only methods).
    segment_values: torch.Tensor
    segment_credits: torch.Tensor
    # Methods with a learned critic (ppo): the critic's values V(s_t) it used and the regression
    # targets it should learn next, both (B, T) float32 with 0 on padding; None for other methods.
    token_values: torch.Tensor | None = None
    value_targets: torch.Tensor | None = None
    # Methods with value estimates: (B, S) bool, whether V(S_k) rests on evidence (True for the
    # last segment, whose value is the reward); False where the estimator had nothing to go on and
    # the previous value was kept. None for methods that do not report it.
    segment_value_covered: torch.Tensor | None = None


# ------------------------------------------------------------------------------------------
# Group statistics shared by every method that centres or normalises within a group
# ------------------------------------------------------------------------------------------
#
# Exactness for all-equal groups: the float32 mean of n copies of x is x when the running sum of
# the copies is exact (binary and dyadic rewards); otherwise it can be a few ulps off x (sixteen
# copies of 0.9536147117614746, summed in order, give a mean 4 ulps above x), the centred rewards
# are a few ulps instead of 0 and the std is of the same size, so GRPO's (r - mean) / (std + eps)
# is O(1) (-0.191 there, up to 0.64 for rewards up to 10) and RLOO's baseline leaves a few ulps.
# verl's ``compute_grpo_outcome_advantage`` and TRL take float32 means and stds too and share the
# defect. Here such a group is detected exactly (max == min: two scatter reductions, cheap) and
# gets its common value as mean and std 0, so its centred rewards are exactly 0 whatever the
# dtype or group size. Float64 statistics were the alternative: exact for all-equal float32
# groups, but they can change the last bit of other groups' advantages (against the float32
# field and this project's recorded runs) and are not exact for all-equal float64 pools
# (delta_belief's). Every non-uniform group keeps the float32 formula bit for bit
# (tests/methods/test_group_stats.py).


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """group_ids (B,) int64 -> (inverse (B,) int64: dense group index of each row, counts (G,))."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    return inverse, counts


def uniform_groups(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) values, (B,) group ids -> (B,) bool: True where every row of the group has the same
    value (compared exactly, in float32; a group of one is uniform)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    lo = torch.full((groups,), float("inf")).scatter_reduce(0, inverse, values.float(), "amin")
    hi = torch.full((groups,), float("-inf")).scatter_reduce(0, inverse, values.float(), "amax")
    return (lo == hi)[inverse]


def group_mean_std(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-completion mean and unbiased std of its group's rewards, in float32.

    rewards: (B,) float, group_ids: (B,) int64 -> (mean (B,), std (B,)). Groups of one completion
    get mean 0 and std 1 (verl's ``compute_grpo_outcome_advantage``); all-equal groups of two or
    more get their common value exactly and std 0 (see the comment above)."""
    rewards = rewards.to(torch.float32)
    inverse, counts = group_index(group_ids)
    sums = torch.zeros(counts.shape[0]).index_add_(0, inverse, rewards)
    means = sums / counts
    sq_dev = torch.zeros(counts.shape[0]).index_add_(0, inverse, (rewards - means[inverse]) ** 2)
    stds = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))
    mean, std = means[inverse], stds[inverse]
    uniform = uniform_groups(rewards, group_ids)
    mean = torch.where(uniform, rewards, mean)
    std = torch.where(uniform, torch.zeros_like(std), std)
    single = counts[inverse] == 1
    return torch.where(single, torch.zeros_like(mean), mean), torch.where(single, torch.ones_like(std), std)


def pool_mean_std(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of a 1-D pool (N >= 1), in its dtype; exact (the common value, 0)
    when every entry is equal (see the comment above). The std of a single entry is 0 here."""
    if bool(values.max() == values.min()):
        return values[0].clone(), torch.zeros((), dtype=values.dtype)
    return values.mean(), values.std()


def broadcast_sequence_advantage(advantage: torch.Tensor, batch: CreditBatch) -> Credit:
    """Give every token and every segment of completion i the scalar ``advantage[i]``.

    advantage: (B,) -> Credit with token_advantages (B, T), segment_credits (B, S), no values.
    """
    mask = batch.token_mask
    tokens = advantage[:, None].to(torch.float32).expand_as(mask) * mask
    num_seg = batch.max_segments
    seg_range = torch.arange(num_seg)[None, :]
    exists = seg_range < batch.num_segments[:, None]
    nan = torch.full((advantage.shape[0], num_seg), float("nan"))
    credits = torch.where(exists, advantage[:, None].to(torch.float32).expand(-1, num_seg), nan)
    return Credit(token_advantages=tokens.contiguous(), segment_values=nan.clone(), segment_credits=credits)
