"""``mc``: VinePPO-style Monte Carlo state values (Kazemnejad et al., "VinePPO", arXiv 2410.01679,
ICML 2025; docs/design/peer-methods.md section 6.1).

From every segment boundary S_k of every completion, ``k`` continuations are sampled from the
current policy and verified by the benchmark (rredcot_cli/values/mc.py):

    V(S_k) = (1/K) sum_j R(tau_j),   tau_j ~ pi(. | prompt, S_k)      k = 0 .. K_i - 1
    V(S_K) = R (the observed, verified reward of the completion)
    A_k    = V(S_k) - V(S_{k-1})     on every token of segment k            (advantage="vineppo")

Shapes: batch of B completions, T tokens, S = max segments; V is (B, S+1), credits (B, S),
token advantages (B, T) with exactly 0 on padding.

Where this deviates from the paper, and why:
- VinePPO writes A_k = r_k + V(s_{k+1}) - V(s_k) with V(terminal) = 0 and r = R on the last step;
  this is the same number as V(S_K) := R above.
- VinePPO's steps are its own newline/sentence splits; here they are the toolkit's segments
  (``segment=...``), so the same segmentation serves every method.
- K defaults to 8 (VinePPO's main configs use 9; the issue fixes 8). Continuations are scored as
  sampled completions are (``grade_completion``; one cut off at its budget as a truncated one, no
  extra unfinished penalty), so MC values and observed rewards mean the same thing; on the
  embedded task an unfinished chain has no answer and scores 0, as in VinePPO.
- Continuations come from the policy's backend (``Backend.continuations``): the HF sampler, or
  vLLM with ``n=k`` per prefix and prefix caching under ``backend=vllm``.
- V(S_0) is estimated by MC from the prompt (``baseline="mc"``, shared by the whole group) or,
  for free, by the group's mean reward (``baseline="group_mean"``: the G completions are G
  samples from S_0).
- VinePPO feeds A_k to PPO as is; ``advantage=immediate|reward_to_go|mixed`` instead uses
  RREDCoT's normalised rules (rredcot.redistribute) on the same values, for comparisons at equal
  advantage scale. ``clip_reward`` (default off) clips r_k for the advantage only.
- The verifier is rebuilt from the benchmark name stored with each sample
  (``batch.extras["benchmarks"]``) with default options; the math benchmarks' configured
  ``verify_timeout_s`` is not carried over (their default, 5 s, applies).

Cost: per completion with K_i segments, K_i x k continuations (plus k per prompt for V(S_0))
of average length about half a completion: roughly 1 + k K_i / 2 completion-equivalents of
generation (docs/design/peer-methods.md section 6.1); ``batch.extras["value_stats"]`` records prefill and
generated tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Literal, Optional, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._attribution import eos_token_ids
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.grpo import group_mean_std
from rredcot_cli.methods.rredcot import AdvantageRule, redistribute, segment_ends
from rredcot_cli.benchmarks import Problem, make_benchmark
from rredcot_cli.benchmarks.base import grade_completion
from rredcot_cli.values.mc import mc_values

MCBaseline = Literal["mc", "group_mean"]


@dataclass
class MCParams:
    k: int = 8  # continuations per boundary
    max_new_tokens: int = 256  # per continuation (the preset ties it to sampling.max_new_tokens)
    temperature: float = 1.0  # the preset ties these to the sampling settings (current policy)
    top_p: float = 1.0  # nucleus sampling of the continuations
    seed: int = 0  # continuations of a prefix depend on (seed, prefix tokens) only
    baseline: MCBaseline = "mc"  # V(S_0): Monte Carlo from the prompt, or the group's mean reward
    advantage: Literal["vineppo", AdvantageRule] = "vineppo"  # vineppo (raw V differences) or an RREDCoT rule
    mix_lambda: float = 1.0  # mixed: A = A_GRPO + mix_lambda * r / sigma
    clip_reward: float = 0.0  # clip r_k for the advantage only (0 = off)
    eps: float = 1e-6  # added to sigma (the group's std of segment rewards)
    rows_per_forward: int = 64  # sequences decoded together (prefixes per chunk = rows // k)


# Meaningful range of each numeric parameter (checked when the config is composed).
MC_RANGES = {
    "k": ">= 1",
    "max_new_tokens": ">= 1",
    "temperature": ">= 0; 0 is greedy",
    "top_p": "(0, 1]",
    "seed": ">= 0",
    "mix_lambda": ">= 0",
    "clip_reward": ">= 0; 0 turns it off",
    "eps": "> 0",
    "rows_per_forward": ">= 1",
}


def assemble_values(boundary_values: list[torch.Tensor], rewards: torch.Tensor, num_segments: torch.Tensor,
                    v0: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, S+1) V(S_0..S_K) from estimates at the inner boundaries.

    boundary_values[i]: (K_i,) estimates at S_0..S_{K_i - 1} when ``v0`` is None, else (K_i - 1,)
    estimates at S_1..S_{K_i - 1} and V(S_0) = v0[i]. Column K_i is the observed reward; columns
    past K_i are NaN.
    """
    B = rewards.shape[0]
    S = int(num_segments.max()) if B else 0
    values = torch.full((B, S + 1), float("nan"))
    for i in range(B):
        K = int(num_segments[i])
        est = boundary_values[i].to(torch.float32)
        if v0 is None:
            values[i, :K] = est
        else:
            values[i, 0] = v0[i]
            values[i, 1:K] = est
        values[i, K] = rewards[i]
    return values


def vineppo_credit(values: torch.Tensor, batch: CreditBatch, clip_reward: float = 0.0) -> Credit:
    """VinePPO advantages: A_k = V(S_k) - V(S_{k-1}) (clipped to +-clip_reward if > 0) on every
    token of segment k, 0 on padding; segment_values = V(S_1..S_K), segment_credits = unclipped
    A_k (they telescope to R - V(S_0))."""
    credit = redistribute(values, batch, advantage="immediate", mix_lambda=0.0, clip_reward=0.0, eps=0.0)
    r = credit.segment_credits
    used = r.clamp(-clip_reward, clip_reward) if clip_reward > 0 else r
    seg_adv = torch.nan_to_num(used, nan=0.0)
    mask = batch.token_mask
    if seg_adv.shape[1]:
        tokens = torch.gather(seg_adv, 1, batch.segment_ids.clamp(min=0)) * mask
    else:
        tokens = torch.zeros(mask.shape)
    return Credit(token_advantages=tokens.to(torch.float32), segment_values=credit.segment_values, segment_credits=r)


def batch_verifier(batch: CreditBatch, tokenizer) -> Callable[[int, list[int], str], Optional[float]]:
    """``verify(i, completion_ids, finish_reason)``: the benchmark's reward for new completion
    tokens of row i (``benchmarks.base.grade_completion``, so a continuation cut off at its budget
    is graded as a truncated sample is),
    rebuilt from the benchmark name and gold answer stored with each sample (the configured
    benchmark object in ``batch.extras['benchmark']`` for rows of its name, so its settings hold)."""
    extras = batch.extras or {}
    names = extras.get("benchmarks")
    if not names or any(n is None for n in names):
        raise ValueError("mc verifies continuations and needs each sample's benchmark name "
                         "(batch.extras['benchmarks'], filled by pipeline.credit_batch from the samples)")
    gold = extras["gold_answers"]
    prompt_ids = extras.get("prompt_ids") or [str(i) for i in range(len(gold))]
    configured = extras.get("benchmark")
    benchmarks = {name: configured if getattr(configured, "name", None) == name else make_benchmark(name)
                  for name in set(names)}
    problems = [Problem(prompt_id=str(prompt_ids[i]), question="", gold_answer=str(gold[i])) for i in range(len(gold))]

    def verify(i: int, completion_ids: list[int], finish_reason: str = "stop") -> Optional[float]:
        text = tokenizer.decode(completion_ids, skip_special_tokens=True)
        return grade_completion(benchmarks[names[i]], text, problems[i], finish_reason)[1]

    return verify


def mc_reference_values(batch: CreditBatch, policy, *, k: int = 16, max_new_tokens: int = 256,
                        temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, baseline: str = "mc",
                        rows_per_forward: int = 64, stats: dict | None = None) -> torch.Tensor:
    """MC state values alone, (B, S+1): V(S_0) (MC from the prompt, or the group mean reward),
    V(S_1..S_{K-1}) from ``k`` continuations each, V(S_K) = observed reward, NaN past K_i.

    The reference that judges other methods' values (use k >= 16)."""
    if baseline not in get_args(MCBaseline):  # the judge stage calls this with its own settings
        raise ValueError(f"unknown baseline {baseline!r}; valid: {', '.join(get_args(MCBaseline))}")

    tokenizer = policy.tokenizer
    eos_ids = eos_token_ids(policy)
    ends = segment_ends(batch)
    offsets = [([0] if baseline == "mc" else []) + e[:-1] for e in ends]
    continue_prefixes = functools.partial(policy.backend.continuations, k=k, temperature=temperature, top_p=top_p,
                                          seed=seed, rows_per_forward=rows_per_forward, stats=stats)
    estimates = mc_values(continue_prefixes, batch.prompt_token_ids, batch.completion_token_ids, offsets,
                          batch_verifier(batch, tokenizer), k=k, max_new_tokens=max_new_tokens, eos_ids=eos_ids)
    v0 = None if baseline == "mc" else group_mean_std(batch.rewards, batch.group_ids)[0]
    return assemble_values(estimates, batch.rewards, batch.num_segments, v0=v0)


@register("mc", params=MCParams, ranges=MC_RANGES, needs=("policy",))
def mc(batch: CreditBatch, *, policy, k: int, max_new_tokens: int, temperature: float, top_p: float, seed: int,
       baseline: str, advantage: str, mix_lambda: float, clip_reward: float, eps: float,
       rows_per_forward: int) -> Credit:
    """MC values at every boundary, then VinePPO advantages (or an RREDCoT rule).

    ``policy`` provides ``backend`` (its ``continuations``: HF or vLLM), ``model`` and ``tokenizer``.
    Defaults of the keyword arguments live in ``MCParams``."""
    if k < 1:
        raise ValueError(f"mc needs k >= 1 continuations, got {k}")
    stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
    values = mc_reference_values(batch, policy, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                                 top_p=top_p, seed=seed, baseline=baseline, rows_per_forward=rows_per_forward,
                                 stats=stats)
    if advantage == "vineppo":
        return vineppo_credit(values, batch, clip_reward=clip_reward)
    return redistribute(values, batch, advantage=advantage, mix_lambda=mix_lambda, clip_reward=clip_reward, eps=eps)
