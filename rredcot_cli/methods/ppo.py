"""``ppo``: PPO's advantage from a learned critic and generalised advantage estimation
(Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
arXiv 1506.02438; "Proximal Policy Optimization Algorithms", arXiv 1707.06347), in the form RLVR
toolkits use for language models (verl ``compute_gae_advantage_return``; docs/design/peer-methods.md section 1.5).

A completion of T tokens is an episode of T actions; state s_t is the prompt plus the first t
completion tokens, V(s_t) the critic's estimate (rredcot_cli/train/critic.py) and the only reward is the
verified one on the last token:

    r_t     = R if t = T - 1 else 0
    delta_t = r_t + gamma V(s_{t+1}) - V(s_t),        V(s_T) = 0 (the episode has ended)
    A_t     = sum_{l >= 0} (gamma lam)^l delta_{t+l}
    G_t     = A_t + V(s_t)                            (the critic's regression target)

and with ``whiten`` the policy sees (A_t - mean A) / std A over every completion token of the
batch (verl ``masked_whiten``). With gamma = lam = 1 (the RLVR defaults) A_t = R - V(s_t): the
critic is a per-token baseline.

Shapes: B completions, T = longest completion, S = most segments. Token advantages (B, T), exactly
0 on padding; ``token_values`` (B, T) and ``value_targets`` (B, T) go back to the training stage,
which fits the critic to the targets after the policy update (that fit, a forward and backward
pass per minibatch step, is a training cost outside this function; ``batch.extras["value_stats"]``
counts the one critic forward made here). Segment values (B, S) are
V(S_k) at the end of segment k (the critic's value at the first token after it; R for the last
segment, as the other value methods report), segment credits (B, S) are the segment's summed TD
errors, sum_{t in k} delta_t, which with gamma = 1 telescopes to V(S_k) - V(S_{k-1}).

Where this deviates from the references, and why:
- verl puts the KL penalty to the reference policy into r_t; here the loss adds it
  (``train.kl_coef``) for every method alike, so comparisons change only the advantage.
- The critic is updated after the policy on the same batch (verl updates it first); both use the
  values computed before either update, so the order only decides which optimizer runs first.
- No critic warm-up phase: every method gets the same policy updates at equal budgets. An
  untrained critic says V = 0, so the first steps are REINFORCE with a whitened reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.rredcot import segment_ends


@dataclass
class PPOParams:
    gamma: float = 1.0  # discount per token (RLVR: 1)
    lam: float = 1.0  # GAE lambda (verl's RLVR default 1: Monte Carlo return minus the critic's baseline)
    whiten: bool = True  # normalise advantages over the batch's completion tokens
    eps: float = 1e-8  # whiten: (x - mean) / sqrt(var + eps)


# Meaningful range of each numeric parameter (checked when the config is composed).
PPO_RANGES = {
    "gamma": "[0, 1]",
    "lam": "[0, 1]",
    "eps": "> 0",
}


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) rewards, (B, T) bool mask -> (B, T) token rewards: R_i on completion i's last token."""
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32)
    lengths = mask.sum(dim=1)
    rows = torch.nonzero(lengths > 0).squeeze(1)
    token_rewards[rows, lengths[rows] - 1] = rewards[rows].to(torch.float32)
    return token_rewards


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns of right-padded episodes.

    token_rewards, values: (B, T) float32; mask: (B, T) bool, True on the first T_i positions.
    Returns (advantages, returns), both (B, T) with 0 on padding; the value after the last token
    is 0 (terminal)."""
    B, T = mask.shape
    mask_f = mask.to(torch.float32)
    values = values.to(torch.float32) * mask_f
    advantages = torch.zeros(B, T)
    next_value = torch.zeros(B)
    running = torch.zeros(B)
    for t in reversed(range(T)):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask_f[:, t]
        advantages[:, t] = running
        next_value = values[:, t]
    return advantages, (advantages + values) * mask_f


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, T) -> (B, T): (x - mean) / sqrt(var + eps) over the True positions of ``mask`` (unbiased
    variance, as verl); 0 elsewhere."""
    values = x[mask]
    if values.numel() < 2:
        return torch.zeros_like(x)
    mean, var = values.mean(), values.var(unbiased=True)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def segment_values_and_credits(values: torch.Tensor, deltas: torch.Tensor, rewards: torch.Tensor,
                               batch: CreditBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) values and TD errors -> (B, S) V(S_k) after each segment and (B, S) summed deltas."""
    S = batch.max_segments
    B = values.shape[0]
    seg_values = torch.full((B, S), float("nan"))
    credits = torch.full((B, S), float("nan"))
    index = batch.segment_ids.clamp(min=0)
    summed = torch.zeros(B, S).scatter_add_(1, index, deltas * batch.token_mask) if S else torch.zeros(B, 0)
    for i, ends in enumerate(segment_ends(batch)):
        K = len(ends)
        for k, end in enumerate(ends):
            seg_values[i, k] = float(rewards[i]) if k == K - 1 else float(values[i, end])
        credits[i, :K] = summed[i, :K]
    return seg_values, credits


@register("ppo", params=PPOParams, ranges=PPO_RANGES, needs=("critic",), batch_wide=True)  # whitening over the batch
def ppo(batch: CreditBatch, *, critic, gamma: float, lam: float, whiten: bool, eps: float) -> Credit:
    """GAE advantages from ``critic.values(prompt_ids, completion_ids) -> (B, T)``; see the module
    docstring. Defaults of the keyword arguments live in ``PPOParams``."""
    mask = batch.token_mask
    values = critic.values(batch.prompt_token_ids, batch.completion_token_ids).to(torch.float32) * mask
    if batch.extras is not None:  # one critic forward over every prompt + completion (cost accounting)
        stats = batch.extras.setdefault("value_stats", {})
        positions = sum(len(p) + len(c) for p, c in zip(batch.prompt_token_ids, batch.completion_token_ids))
        stats["forward_tokens"] = stats.get("forward_tokens", 0) + positions
    token_rewards = terminal_rewards(batch.rewards, mask)
    advantages, returns = gae(token_rewards, values, mask, gamma, lam)
    next_values = torch.cat([values[:, 1:], torch.zeros(values.shape[0], 1)], dim=1)
    deltas = (token_rewards + gamma * next_values - values) * mask
    seg_values, credits = segment_values_and_credits(values, deltas, batch.rewards, batch)
    token_advantages = masked_whiten(advantages, mask, eps) if whiten else advantages
    return Credit(token_advantages=token_advantages.to(torch.float32), segment_values=seg_values,
                  segment_credits=credits, token_values=values, value_targets=returns)
