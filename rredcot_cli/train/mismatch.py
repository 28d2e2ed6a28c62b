"""Sampler/trainer mismatch: how far the log-probs the sampler recorded are from the trainer's.

The sampler (HF generate, or a vLLM engine with other kernels, batch shapes and precision)
records log pi_sampler(y_t) for every token it draws; the trainer scores the same tokens with
the same weights, log pi_trainer(y_t). With identical numbers the update is on-policy; every
difference makes it slightly off-policy (Yao et al. 2025, "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training"; Liu, Li et al. 2025, "When Speed Kills Stability:
Demystifying RL Collapse from the Training-Inference Mismatch"). The loop reports it every step
as the ``mismatch_*`` columns of ``metrics.parquet`` (``MismatchStats.columns``), with

    delta_t = log pi_trainer(y_t) - log pi_sampler(y_t)      rho_t = exp(delta_t)

over the completion tokens of the step, y_t drawn by the sampler:

mismatch_logp_abs_mean  mean |delta_t| (slime's ``train_rollout_logprob_abs_diff``, a token mean here)
mismatch_logp_abs_max   max |delta_t|
mismatch_kl             mean of rho_t - 1 - delta_t: Schulman's k3 estimator of KL(sampler || trainer)
                        (the tokens are the sampler's draws and rho = pi_trainer / pi_sampler;
                        prime-rl's ``mismatch_kl``); >= 0 per token, unbiased, computed in float64
                        as expm1(delta) - delta so tiny differences do not cancel to 0
mismatch_past_cap       share of tokens with rho_t > train.sampler_correction_cap: what
                        ``token_truncate`` truncates and ``token_mask`` masks (whichever correction
                        is on, ``none`` included)
mismatch_tokens         the tokens the statistics were taken over (0: none measured)

The trainer's log-probs are those of the policy that sampled: the pre-update pass over the
whole batch (``train.old_logprobs=recompute``), or, where the sampler's log-probs stand in for
that pass (``old_from_sampler``), the forwards of the update's first minibatch, which run
before the first optimizer step (the whole batch when ``train.minibatch_size`` covers it;
``mismatch_tokens`` says how many tokens). A step whose update runs no forward (no group with
differing rewards under dynamic sampling, or a batch without signal, ``update.carries_no_signal``)
measures nothing: NaN in every column and 0 tokens.

The functions here are pure: (B, T) tensors in, numbers out; ``MismatchSums`` adds up across
micro-batches and ranks before ``MismatchStats`` divides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PREFIX = "mismatch_"


@dataclass(frozen=True)
class MismatchStats:
    """One step's sampler/trainer mismatch (module docstring); NaN and 0 tokens when not measured."""

    logp_abs_mean: float = math.nan
    logp_abs_max: float = math.nan
    kl: float = math.nan
    past_cap: float = math.nan
    tokens: int = 0

    def columns(self) -> dict:
        """The metrics-row columns, ``mismatch_``-prefixed."""
        return {f"{PREFIX}logp_abs_mean": self.logp_abs_mean, f"{PREFIX}logp_abs_max": self.logp_abs_max,
                f"{PREFIX}kl": self.kl, f"{PREFIX}past_cap": self.past_cap, f"{PREFIX}tokens": self.tokens}


COLUMNS = tuple(MismatchStats().columns())


@dataclass
class MismatchSums:
    """Sums the statistics are made of, so micro-batches and ranks add up before dividing:
    sum |delta|, max |delta|, sum k3, tokens with rho > cap, tokens."""

    abs_sum: float = 0.0
    abs_max: float = -math.inf
    k3_sum: float = 0.0
    past_cap: float = 0.0
    tokens: float = 0.0

    def add(self, other: "MismatchSums") -> "MismatchSums":
        self.abs_sum += other.abs_sum
        self.abs_max = max(self.abs_max, other.abs_max)
        self.k3_sum += other.k3_sum
        self.past_cap += other.past_cap
        self.tokens += other.tokens
        return self

    def over_ranks(self, parallel) -> "MismatchSums":
        """The sums of every rank of ``parallel`` (``distributed.DataParallel``); every rank
        gets the same. The max travels as one slot per rank of a summed vector."""
        if parallel.world_size == 1:
            return self
        maxima = [0.0] * parallel.world_size
        maxima[parallel.rank] = self.abs_max if self.tokens else -math.inf
        summed = parallel.sum([self.abs_sum, self.k3_sum, self.past_cap, self.tokens, *maxima])
        return MismatchSums(abs_sum=summed[0], abs_max=max(summed[4:]), k3_sum=summed[1], past_cap=summed[2],
                            tokens=summed[3])

    def stats(self) -> MismatchStats:
        if not self.tokens:
            return MismatchStats()
        n = self.tokens
        return MismatchStats(logp_abs_mean=self.abs_sum / n, logp_abs_max=self.abs_max, kl=self.k3_sum / n,
                             past_cap=self.past_cap / n, tokens=int(n))


def mismatch_sums(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                  cap: float) -> MismatchSums:
    """The sums of ``MismatchSums`` over the positions where ``mask`` is True.

    trainer_logprobs, sampler_logprobs: (B, T) log-probs of the sampled tokens (any float dtype,
    any device; taken to float64 before subtracting); mask: (B, T) bool, True on completion
    tokens; cap: the ratio above which a token counts as past the cap (> 0)."""
    if cap <= 0:
        raise ValueError(f"the mismatch cap must be > 0, got {cap}")
    m = mask.bool()
    delta = (trainer_logprobs.detach().double() - sampler_logprobs.detach().double())[m]
    if delta.numel() == 0:
        return MismatchSums()
    absolute = delta.abs()
    return MismatchSums(abs_sum=float(absolute.sum()), abs_max=float(absolute.max()),
                        k3_sum=float((torch.expm1(delta) - delta).sum()),
                        past_cap=float((delta > math.log(cap)).sum()), tokens=float(delta.numel()))


def mismatch_stats(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                   cap: float) -> MismatchStats:
    """``MismatchStats`` of one (B, T) batch (``mismatch_sums``, then divided)."""
    return mismatch_sums(trainer_logprobs, sampler_logprobs, mask, cap).stats()
