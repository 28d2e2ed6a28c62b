"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al., 2024, "Back to Basics:
Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
arXiv 2402.14740).

Every token of completion i in a group of k completions gets

    A_i = r_i - (1 / (k - 1)) * sum_{j != i} r_j  =  k / (k - 1) * (r_i - mean(r_group))

the reward minus the mean reward of the *other* completions: an unbiased baseline (it does not
depend on y_i) with no std scaling. A group of one completion has no other samples; it keeps its
raw reward, as verl's ``compute_rloo_outcome_advantage`` does (and as ``grpo`` does here).
A group whose rewards are all equal gets exactly 0 (verl's float32 sums can leave a few ulps
there when the rewards are not binary or dyadic; issue 30).

The original paper optimises sequence-level REINFORCE with a KL-shaped reward; as in verl's
``rloo`` estimator, this method only supplies the advantage and the shared clipped surrogate
(``train.clip_low``/``clip_high``, ``train.kl_coef``) is the loss.

TRL 1.16's ``RLOOTrainer`` computes the same advantage (tested against it,
tests/methods/test_oracle_trl.py) but gives a group of one 0, and its loss clips a
sequence-level ratio exp(sum_t log-ratio) and averages over sequences: on-policy its gradient is
this token-level loss's with ``train.loss_agg=constant`` and a budget of 1; off-policy they clip
differently (tests/train/test_oracle_trl_loss.py).

Shapes: rewards (B,), group_ids (B,) -> token advantages (B, T), exactly 0 on padding; segment
credits (B, S) = A_i on every existing segment; no state values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, broadcast_sequence_advantage, group_index, uniform_groups


@dataclass
class RLOOParams:
    pass


def rloo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) rewards, (B,) group ids -> (B,) leave-one-out advantages r_i - mean_{j != i} r_j."""
    rewards = rewards.to(torch.float32)
    inverse, counts = group_index(group_ids)
    sums = torch.zeros(counts.shape[0]).index_add_(0, inverse, rewards)
    k = counts[inverse].to(torch.float32)
    others_mean = (sums[inverse] - rewards) / (k - 1).clamp(min=1)
    # An all-equal group's float32 sum can be a few ulps off k r (base.py, group statistics):
    # its advantage is exactly 0, not those ulps.
    advantage = torch.where(uniform_groups(rewards, group_ids), torch.zeros_like(rewards), rewards - others_mean)
    # k = 1: no other completion to form a baseline from, so the baseline is 0.
    return torch.where(k > 1, advantage, rewards)


@register("rloo", params=RLOOParams)
def rloo(batch: CreditBatch) -> Credit:
    """Leave-one-out advantage broadcast to all tokens and segments; no state values."""
    return broadcast_sequence_advantage(rloo_advantage(batch.rewards, batch.group_ids), batch)
