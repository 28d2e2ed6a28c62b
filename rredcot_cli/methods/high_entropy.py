"""High-entropy minority tokens: the policy gradient only on the forking tokens (Wang, Yu, et al.,
2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning
for LLM Reasoning", arXiv 2506.01939; TRL's ``GRPOConfig.top_entropy_quantile``).

The advantage is GRPO's (``grpo.grpo_advantage``, broadcast to every token). What changes is the
loss: only the tokens whose entropy is in the top ``top_quantile`` of the update's forward pass
carry the policy-gradient term:

    H_t      = -sum_v pi(v | s_t) log pi(v | s_t)          entropy of the next-token distribution
                                                            at each completion token, from the
                                                            update's own forward (no gradient)
    tau      = quantile({H_t : t a completion token of the pass}, 1 - top_quantile)
                                                            (torch.quantile, linear interpolation)
    m_t      = 1[H_t >= tau] on completion tokens, 0 on padding
    L_t      = m_t * clipped-surrogate_t + kl_coef * KL_t   (train/loss.py ``token_weights``)

with the token mean over *all* completion tokens (a left-out token still counts in the
denominator). That is TRL's ``get_high_entropy_mask(entropies, mask, 1 - top_entropy_quantile)``
applied in ``_compute_loss`` (read in TRL's ``grpo_trainer.py``; its test: 10 valid tokens and
top 20% keep the 2 largest entropies), including the KL term being left unmasked; the paper's
recommended rho is 0.2.

Deviations, and why:
- The quantile is taken over the tokens of each forward of the update: one micro-batch here
  (``train.micro_batch_size`` / ``train.micro_batch_tokens``; on CPU the auto token budget
  splits a 32-row minibatch into a few passes), as TRL takes it over each forward's batch gathered
  across processes (its per-device batch). With ``train.micro_batch_size=0
  train.micro_batch_tokens=0`` it is the whole minibatch, the paper's batch-level percentile. So,
  unlike every other method here, the micro-batch split changes the update slightly. Under
  torchrun each rank's quantile is its own (TRL gathers the entropies of all processes).
- Entropies come from the temperature/top-p distribution the update's log-probs use
  (``ForwardPass``), i.e. the sampling distribution, as TRL computes them from the logits divided
  by its temperature.

``rredcot attribute`` writes GRPO's credit (the selection needs the update's forward);
``rredcot judge`` scores the credit the update trains on, GRPO's advantage on the selected tokens,
with entropies from one pass over the judged batch (``pipeline.selected_credit``).

Shapes: the credit is GRPO's (token advantages (B, T), 0 on padding; segment credits (B, S));
``high_entropy_mask``: entropies (B, T) float, mask (B, T) bool -> (B, T) float32 0/1.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, broadcast_sequence_advantage
from rredcot_cli.methods.grpo import grpo_advantage


@dataclass
class HighEntropyParams:
    # Share of the pass's completion tokens, by entropy, that carry the policy gradient (paper: 0.2).
    top_quantile: float = 0.2
    scale_by_std: bool = True  # host advantage: GRPO (true) | Dr. GRPO (false)
    eps: float = 1e-6  # added to the group's reward std (host advantage)


HIGH_ENTROPY_RANGES = {
    "top_quantile": "(0, 1]",
    "eps": "> 0",
}


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """(B, T) entropies, (B, T) bool completion mask -> (B, T) float32: 1 on the completion tokens
    whose entropy is >= the (1 - top_quantile) quantile of the masked entropies, else 0 (all 0
    when there is no completion token). Ties at the threshold are all kept, as in TRL."""
    if not 0.0 < top_quantile <= 1.0:
        raise ValueError(f"top_quantile must be in (0, 1], got {top_quantile}")
    mask = mask.bool()
    values = entropies[mask].float()
    if values.numel() == 0:
        return torch.zeros(entropies.shape, dtype=torch.float32, device=entropies.device)
    threshold = torch.quantile(values, 1.0 - top_quantile)
    return ((entropies.float() >= threshold) & mask).to(torch.float32)


def _loss_tokens(params: dict):
    return functools.partial(high_entropy_mask, top_quantile=float(params["top_quantile"]))


@register("high_entropy", params=HighEntropyParams, ranges=HIGH_ENTROPY_RANGES, loss_tokens=_loss_tokens)
def high_entropy(batch: CreditBatch, *, top_quantile: float = 0.2, scale_by_std: bool = True,
                 eps: float = 1e-6) -> Credit:
    """GRPO's outcome advantage on every token; the token selection happens in the loss
    (``high_entropy_mask``, registered as ``loss_tokens``)."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    return broadcast_sequence_advantage(advantage, batch)
