"""Shared pieces of the token-reweighting methods (cscr, sc_grpo, cort), which all compute
A_{i,t} = A_i * w_{i,t} with stop-gradient weights w >= 0 of mean 1 over a completion's tokens
(docs/design/peer-methods.md section 0: the "credit budget" sum_t A_{i,t} = T_i A_i is preserved).

Pure tensor functions on (B, T) inputs with a (B, T) bool ``mask`` of completion tokens; every
output is exactly 0 on padding.
"""

from __future__ import annotations

import torch

from rredcot_cli.methods.base import Credit, CreditBatch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, 1) mean over the masked positions of each row (0 for an empty row)."""
    x = torch.where(mask, x, torch.zeros_like(x))
    return x.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)


def masked_std(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, 1) population std over the masked positions (0 for rows of <= 1 token).
    Population rather than unbiased so a one-token completion gets 0, not NaN."""
    dev = torch.where(mask, x - masked_mean(x, mask), torch.zeros_like(x))
    return torch.sqrt((dev**2).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1))


def mean_one(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rescale each row so its masked entries average 1 (w_t * T_i / sum_t w_t); 0 on padding.
    Entries must be >= 0 with a positive masked sum."""
    w = torch.where(mask, w, torch.zeros_like(w))
    return w * mask.sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1e-12)


def reweighted_credit(advantage: torch.Tensor, weights: torch.Tensor, batch: CreditBatch) -> Credit:
    """advantage (B,), weights (B, T) -> Credit with token advantages A_i * w_{i,t} (0 on
    padding), segment credits = the mean token advantage over each segment's tokens (NaN past
    K_i) and no state values."""
    mask = batch.token_mask
    tokens = torch.where(mask, advantage[:, None].to(torch.float32) * weights.to(torch.float32), torch.zeros(()))
    B, S = mask.shape[0], batch.max_segments
    index = batch.segment_ids.clamp(min=0)
    sums = torch.zeros(B, S).scatter_add_(1, index, tokens)
    counts = torch.zeros(B, S).scatter_add_(1, index, mask.to(torch.float32))
    nan = torch.full((B, S), float("nan"))
    credits = torch.where(counts > 0, sums / counts.clamp(min=1), nan)
    return Credit(token_advantages=tokens.contiguous(), segment_values=nan.clone(), segment_credits=credits)


def padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack 1-D tensors into a (len(rows), width) float32 tensor, right-padded with 0."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out
