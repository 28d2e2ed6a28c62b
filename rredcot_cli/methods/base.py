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
