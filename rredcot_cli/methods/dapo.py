"""DAPO advantage (Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale", arXiv 2503.14476): group-normalised advantage of a length-shaped reward.

Reward of completion i (length |y_i| tokens, known from ``segment_ids``):

    R_i = c_i + R_len(|y_i|),   c_i = 2 r_i - 1 (DAPO's +-1 correctness; ``signed_reward``)
    R_len(L) = 0                              if L <= L_max - L_cache
             = ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
             = -1                             if L > L_max
    A_i = (R_i - mean(R_group)) / (std(R_group) + eps)     (unbiased std, as grpo)

with L_max = ``max_length`` (set it to ``sampling.max_new_tokens``, the generation budget, as the
paper's 20480) and L_cache = ``cache_length`` (the paper's 4096: the soft-penalty zone at the end
of the budget). ``overlong_filter`` zeroes the advantage of completions of length >= L_max (they
hit the budget, i.e. were truncated: the paper's "overlong filtering"; the batch carries no finish
reasons, so a completion that ends exactly at the budget counts as truncated).

DAPO's other three techniques live outside the advantage:
  - clip-higher (eps_low 0.2, eps_high 0.28): ``train.clip_low=0.2 train.clip_high=0.28``;
  - token-level loss: ``train.loss_agg=token-mean``; no KL term: ``train.kl_coef=0``
    (``experiment=dapo`` sets all of these);
  - dynamic sampling (over-sample prompts, drop groups whose accuracy is 0 or 1, refill the
    batch) is a training-loop option, ``train.dynamic_sampling=true`` (rredcot_cli/train/loop.py
    ``training_samples``), because it draws new samples. Without it, ``zero_uniform_groups`` gives
    a group whose correctness rewards are all equal advantage 0 even when the length penalty
    differs within it, so such groups add no gradient; unlike dynamic sampling they still count in
    the token-mean denominator and are not replaced by informative groups.

Deviations from verl (``recipe/dapo``: the ``grpo`` advantage of the shaped score):
  - A group of one completion (``sampling.n=1``) gets advantage 0 here: it is uniform, so
    ``zero_uniform_groups`` zeroes it. verl's ``compute_grpo_outcome_advantage`` gives a group of
    one mean 0 and std 1, i.e. A = R_i / (1 + eps) (1.0 for a correct completion within the free
    length; its dynamic sampling keeps groups of one). ``zero_uniform_groups=false`` gives verl's
    value (``grpo_advantage``'s group of one). DAPO needs groups (G = 16 in the paper), so this
    only matters for a misconfigured run.
  - A group whose shaped rewards are all equal gets exactly 0 (``base.group_mean_std``; verl's
    float32 mean can be a few ulps off and give it an O(1) advantage, issue 30).

Shapes: rewards (B,), group_ids (B,), segment_ids (B, T) -> token advantages (B, T), exactly 0 on
padding; segment credits (B, S) = A_i on every existing segment; no state values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, broadcast_sequence_advantage, uniform_groups
from rredcot_cli.methods.grpo import grpo_advantage


@dataclass
class DAPOParams:
    signed_reward: bool = True  # correctness reward 2r - 1 in {-1, +1} (DAPO) instead of r
    overlong_shaping: bool = True  # add R_len (soft overlong punishment)
    max_length: int = 256  # L_max: the generation budget (sampling.max_new_tokens)
    cache_length: int = 64  # L_cache: length of the soft-penalty zone before L_max
    overlong_filter: bool = False  # zero the advantage of completions of length >= L_max
    zero_uniform_groups: bool = True  # uniform groups get advantage 0 (see the module docstring)
    eps: float = 1e-6  # added to the group's reward std


# Meaningful range of each numeric parameter (checked when the config is composed).
DAPO_RANGES = {
    "max_length": ">= 1",
    "cache_length": "[0, max_length]",
    "eps": "> 0",
}


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache_length: int) -> torch.Tensor:
    """(B,) completion lengths -> (B,) R_len: 0, then linear down to -1 over the last
    ``cache_length`` tokens of the budget, -1 beyond ``max_length``."""
    if not 0 <= cache_length <= max_length:
        raise ValueError(f"dapo needs 0 <= cache_length <= max_length, got {cache_length} and {max_length}")
    lengths = lengths.to(torch.float32)
    expected = max_length - cache_length
    soft = (expected - lengths) / max(cache_length, 1)
    penalty = torch.where(lengths <= expected, torch.zeros_like(lengths), soft)
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)


def dapo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, lengths: torch.Tensor, *, signed_reward: bool,
                   overlong_shaping: bool, max_length: int, cache_length: int, overlong_filter: bool,
                   zero_uniform_groups: bool, eps: float) -> torch.Tensor:
    """(B,) rewards in [0, 1], (B,) group ids, (B,) completion lengths -> (B,) advantages."""
    rewards = rewards.to(torch.float32)
    shaped = 2 * rewards - 1 if signed_reward else rewards.clone()
    if overlong_shaping:
        shaped = shaped + overlong_penalty(lengths, max_length, cache_length)
    advantage = grpo_advantage(shaped, group_ids, scale_by_std=True, eps=eps)
    if zero_uniform_groups:
        advantage = torch.where(uniform_groups(rewards, group_ids), torch.zeros_like(advantage), advantage)
    if overlong_filter:
        advantage = torch.where(lengths >= max_length, torch.zeros_like(advantage), advantage)
    return advantage


@register("dapo", params=DAPOParams, ranges=DAPO_RANGES)
def dapo(batch: CreditBatch, *, signed_reward: bool, overlong_shaping: bool, max_length: int, cache_length: int,
         overlong_filter: bool, zero_uniform_groups: bool, eps: float) -> Credit:
    """DAPO advantage broadcast to all tokens and segments; no state values. Defaults of the
    keyword arguments live in ``DAPOParams``."""
    lengths = batch.token_mask.sum(dim=1)
    advantage = dapo_advantage(batch.rewards, batch.group_ids, lengths, signed_reward=signed_reward,
                               overlong_shaping=overlong_shaping, max_length=max_length, cache_length=cache_length,
                               overlong_filter=overlong_filter, zero_uniform_groups=zero_uniform_groups, eps=eps)
    return broadcast_sequence_advantage(advantage, batch)
