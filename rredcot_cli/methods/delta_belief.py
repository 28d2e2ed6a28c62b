"""ΔBelief-RL: the change in the policy's own belief in the target answer as a dense reward
(Auzina, Strüber, Hernández-Gutiérrez, Goel, Prabhu, Bethge, 2026, "Intrinsic Credit Assignment
for Long Horizon Interaction", arXiv 2602.12342; code: github.com/bethgelab/delta-belief-rl,
read for this file: ``llm_agent/generation.py``, ``trainer/ppo/core_algos.py``, ``train.py`` and
the ``scripts/train/delta-belief-rl`` launchers).

The paper's turns are our segments. After segment k of completion i the belief in the target
(gold) answer y* is elicited from the policy itself, with no generation:

    log b_{i,k} = log pi(y* | x, S_{i,k}, probe)          k = 0..K_i  (S_0 = the prompt alone)
    Δ_{i,k}     = log b_{i,k} - log b_{i,k-1}              k = 1..K_i
    r_{i,k}     = R_i + segment_penalty * K_i + lam * shape(Δ_{i,k})
    A_{i,k}     = (r_{i,k} - mean_j r_{j,k}) / (std_j r_{j,k} + eps)   j over i's group, per k
    A_{i,t}     = A_{i,k(t)}                               every token of segment k

- b is read with RREDCoT's ``answer_probe`` machinery (values/answer_probe.py, same forced-answer
  template, same packed / KV-cache probe scorers), in log space: ``answer_probe_log_values``.
  ``agg``: the summed (paper default ``agg: sum``) or mean log-prob of the answer's tokens.
  ``targets="gold"`` probes the gold answer only (the paper's ground-truth secret);
  ``"verified"`` takes log of the probability of RREDCoT's answer set D (gold + the group's
  verified answers).
- ``shape`` (the code's ``logprob_reward.methods``): ``positive`` = max(Δ, 0), the paper's
  intrinsic-exploration term and the launchers' setting (``methods=[positive]``); ``raw`` = Δ;
  ``clip`` = clamp(Δ, clip_min, clip_max) (the code's ``min_max``); ``tanh`` = tanh(tau Δ).
  ``lam`` = the launchers' ``weight_elicit=0.1``.
- Outcome: like the code's ``grpo_turn`` reward manager, the end-of-game reward (here the verified
  reward R_i, plus ``segment_penalty`` per segment, the code's ``traj_len`` signal, 0 by default)
  is added to *every* turn, and turn-wise GRPO normalises each turn index k over the group
  (unbiased std; ``scale_by_std=false`` = Dr. GRPO; a group of one gets mean 0, std 1).
  ``missing_segments="zero"``: as in the code, a completion with fewer than k segments counts as
  a reward of 0 in turn k's statistics (its reward row is zero-padded); ``"skip"`` leaves it out.

Deviations from the paper / code, and why:
- ``final_segment="outcome"`` (default): the final segment gets Δ = 0 and only the outcome. The
  code sets Δ = 0 on the turn that ends the game (finished episodes' diffs become NaN, then 0);
  a completion's final segment is the one that writes the answer and ends the episode, and a
  forced-answer probe appended after an already written answer measures the template, not a
  belief. ``"probe"`` probes after the whole completion (trailing EOS removed) instead.
- Turns: the paper's turns are dialogue turns with an oracle's reply; here they are segments of
  one completion (``segment=...``), and b_k is probed right after segment k.
- The code's other reward signals (invalid / repeated question penalties, win bonus 2.0) have no
  counterpart on a verified-answer task; R_i is the verified 0/1 reward. Its episode- / batch- /
  group-centring variants of the shaping are not implemented (the launchers use none of them).
- Chat template: the code puts the elicitation in an assistant message; here it is the
  benchmark's ``ANSWER_PROBE`` appended to the trace (as RREDCoT's answer_probe).

Shapes: log-beliefs (B, S+1) (column k = log b_k, NaN where not probed) -> Δ (B, S) -> segment
rewards r (B, S) -> advantages (B, S) -> token advantages (B, T), 0 on padding. Credit:
segment_values = b_k for k = 1..K_i (the last one is R_i under ``final_segment=outcome``, as the
value methods put it), segment_credits = A_{i,k} (the advantage the segment's tokens get).
Cost: (K_i [+1]) x |D| short probes per completion (one trace encoding with ``kv_cache``), no
generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, pool_mean_std
from rredcot_cli.methods._attribution import eos_token_ids, reasoning_ends
from rredcot_cli.methods.rredcot import answer_candidates, segment_ends
from rredcot_cli.values.answer_probe import Candidate, answer_probe_log_values, probe_tokens
from rredcot_cli.values.packing import cached_probe_logprobs, packed_probe_logprobs

Shaping = Literal["positive", "raw", "clip", "tanh"]
FinalSegment = Literal["outcome", "probe"]
MissingSegments = Literal["zero", "skip"]
ProbeScoring = Literal["packed", "kv_cache"]  # values/packing.py


@dataclass
class DeltaBeliefParams:
    lam: float = 0.1  # weight of the belief term (the launchers' weight_elicit)
    shaping: Shaping = "positive"  # of the belief change Δ: max(Δ, 0), Δ, clip(Δ), tanh(tau Δ)
    clip_min: float = -2.0  # shaping=clip: lower bound of Δ
    clip_max: float = 2.0  # shaping=clip: upper bound of Δ
    tau: float = 1.0  # shaping=tanh: tanh(tau * Δ)
    agg: Literal["sum", "mean"] = "sum"  # of the answer tokens' log-probs
    targets: Literal["gold", "verified"] = "gold"  # the gold answer, or gold + the group's verified answers
    final_segment: FinalSegment = "outcome"  # outcome (Δ_K = 0) or probe (probe after the whole completion)
    missing_segments: MissingSegments = "zero"  # zero (the code: absent turns count as 0) or skip
    segment_penalty: float = 0.0  # added to the outcome once per segment (the code's traj_len)
    scale_by_std: bool = True  # turn-wise GRPO (true) | Dr. GRPO (false)
    eps: float = 1e-6  # added to the std of each turn-wise pool
    # Forced-answer template with {answer} (and {eos}); null = the benchmark's ANSWER_PROBE.
    probe_template: Optional[str] = None
    probe_scoring: ProbeScoring = "packed"  # how probes reuse their prefix (values/packing.py)


# Meaningful range of each numeric parameter (checked when the config is composed).
DELTA_BELIEF_RANGES = {
    "lam": ">= 0",
    "clip_min": "<= 0",
    "clip_max": ">= 0",
    "tau": "> 0",
    "segment_penalty": "<= 0; a cost per segment",
    "eps": "> 0",
}


def belief_changes(log_beliefs: torch.Tensor, num_segments: torch.Tensor, final_segment: str) -> torch.Tensor:
    """(B, S+1) log b_0..log b_K -> (B, S) Δ_k = log b_k - log b_{k-1}, NaN past K_i; with
    ``final_segment="outcome"`` the final segment's Δ is 0 (its log b need not exist)."""
    if final_segment not in get_args(FinalSegment):  # called directly, not only through a composed config
        raise ValueError(f"unknown final_segment {final_segment!r}; valid: {', '.join(get_args(FinalSegment))}")
    log_beliefs = log_beliefs.to(torch.float64)
    delta = log_beliefs[:, 1:] - log_beliefs[:, :-1]
    S = delta.shape[1]
    k = torch.arange(S)[None, :]
    if final_segment == "outcome":
        delta = torch.where(k == num_segments[:, None] - 1, torch.zeros_like(delta), delta)
    return torch.where(k < num_segments[:, None], delta, torch.full_like(delta, float("nan")))


def shape_changes(delta: torch.Tensor, shaping: str, *, clip_min: float = -2.0, clip_max: float = 2.0,
                  tau: float = 1.0) -> torch.Tensor:
    """Δ (any shape) -> the shaped belief reward; NaN stays NaN."""
    if shaping == "positive":
        return torch.where(torch.isnan(delta), delta, delta.clamp(min=0))
    if shaping == "raw":
        return delta
    if shaping == "clip":
        return torch.where(torch.isnan(delta), delta, delta.clamp(clip_min, clip_max))
    if shaping == "tanh":
        return torch.tanh(tau * delta)
    raise ValueError(f"unknown shaping {shaping!r}; valid: {', '.join(get_args(Shaping))}")


def turnwise_grpo(r: torch.Tensor, group_ids: torch.Tensor, num_segments: torch.Tensor, *, missing_segments: str,
                  scale_by_std: bool, eps: float) -> torch.Tensor:
    """(B, S) segment rewards (NaN past K_i) -> (B, S) advantages normalised per group and
    segment index k: (r - mean_k) / (std_k + eps) (unbiased std), NaN past K_i. A completion
    without segment k counts as r = 0 (``missing_segments="zero"``) or is left out (``"skip"``);
    a group with a single entry at k gets mean 0 and std 1, an all-equal pool exactly 0."""
    if missing_segments not in get_args(MissingSegments):  # called directly, not only through a composed config
        raise ValueError(f"unknown missing_segments {missing_segments!r}; valid: {', '.join(get_args(MissingSegments))}")
    r = r.to(torch.float64)
    exists = torch.arange(r.shape[1])[None, :] < num_segments[:, None]
    filled = torch.where(exists, r, torch.zeros_like(r))
    out = torch.full_like(r, float("nan"))
    for g in group_ids.unique():
        rows = (group_ids == g).nonzero().flatten()
        for k in range(r.shape[1]):
            present = exists[rows, k]
            if not bool(present.any()):
                continue
            pool = filled[rows, k] if missing_segments == "zero" else filled[rows[present], k]
            if pool.numel() > 1:
                mean, std = pool_mean_std(pool)  # exact for an all-equal pool
            else:
                mean, std = torch.zeros((), dtype=r.dtype), torch.ones((), dtype=r.dtype)
            centred = filled[rows[present], k] - mean
            out[rows[present], k] = centred / (std + eps) if scale_by_std else centred
    return out


def delta_belief_credit(log_beliefs: torch.Tensor, batch: CreditBatch, *, lam: float, shaping: str,
                        clip_min: float, clip_max: float, tau: float, final_segment: str, missing_segments: str,
                        segment_penalty: float, scale_by_std: bool, eps: float) -> Credit:
    """Credit from log-beliefs (B, S+1) (column k = log b_k; the module docstring's formulas)."""
    S = batch.max_segments
    log_beliefs = log_beliefs[:, : S + 1]
    delta = belief_changes(log_beliefs, batch.num_segments, final_segment)
    shaped = shape_changes(delta, shaping, clip_min=clip_min, clip_max=clip_max, tau=tau)
    outcome = batch.rewards.to(torch.float64) + segment_penalty * batch.num_segments.to(torch.float64)
    r = outcome[:, None] + lam * shaped
    advantages = turnwise_grpo(r, batch.group_ids, batch.num_segments, missing_segments=missing_segments,
                               scale_by_std=scale_by_std, eps=eps)
    mask = batch.token_mask
    seg_adv = torch.nan_to_num(advantages, nan=0.0).to(torch.float32)
    tokens = torch.gather(seg_adv, 1, batch.segment_ids.clamp(min=0)) * mask if S else torch.zeros(mask.shape)
    exists = torch.arange(S)[None, :] < batch.num_segments[:, None]
    values = log_beliefs[:, 1:].to(torch.float64).exp()
    if final_segment == "outcome":
        last = torch.arange(S)[None, :] == batch.num_segments[:, None] - 1
        values = torch.where(last, batch.rewards.to(torch.float64)[:, None].expand_as(values), values)
    values = torch.where(exists, values, torch.full_like(values, float("nan")))
    return Credit(token_advantages=tokens.to(torch.float32).contiguous(), segment_values=values.to(torch.float32),
                  segment_credits=advantages.to(torch.float32))


def log_beliefs(batch: CreditBatch, policy, *, template: str, agg: str, targets: str, final_segment: str,
                probe_scoring: str) -> torch.Tensor:
    """(B, S+1) float64: log b_k after the prompt (k = 0) and after segments 1..K_i-1 (and K_i with
    ``final_segment="probe"``), NaN elsewhere."""
    tok = policy.tokenizer
    if targets == "verified":
        candidates = answer_candidates(batch, tok, template)
    else:
        candidates = []
        for gold in batch.extras["gold_answers"]:
            context, scored = probe_tokens(tok, template, str(gold).strip())
            candidates.append([Candidate(context=context, answer=scored, utility=1.0)])
    ends = segment_ends(batch)
    offsets = [[0] + e[:-1] for e in ends]
    if final_segment == "probe":
        for offs, end in zip(offsets, reasoning_ends(batch, eos_token_ids(policy), "none")):
            offs.append(end)
    prompts, completions = batch.prompt_token_ids, batch.completion_token_ids
    traces = [list(p) + list(c) for p, c in zip(prompts, completions)]
    prefix_lens = [[len(prompts[i]) + o for o in offs] for i, offs in enumerate(offsets)]
    stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
    scorer = packed_probe_logprobs if probe_scoring == "packed" else cached_probe_logprobs
    rows = answer_probe_log_values(policy.model, traces, prefix_lens, candidates, agg=agg, device=policy.device,
                                   stats=stats, scorer=scorer)
    out = torch.full((len(traces), batch.max_segments + 1), float("nan"), dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


@register("delta_belief", params=DeltaBeliefParams, ranges=DELTA_BELIEF_RANGES, needs=("policy",),
          forced_answer=lambda params: True)
def delta_belief(batch: CreditBatch, *, policy, lam: float, shaping: str, clip_min: float, clip_max: float, tau: float,
                 agg: str, targets: str, final_segment: str, missing_segments: str, segment_penalty: float,
                 scale_by_std: bool, eps: float, probe_template: Optional[str], probe_scoring: str) -> Credit:
    """Belief-change segment rewards with turn-wise GRPO; ``policy`` (model, tokenizer, device)
    probes its own belief. ``batch.extras`` must hold ``gold_answers`` (and ``pred_answers`` for
    ``targets=verified``) and, without ``probe_template``, ``answer_probe``. Defaults of the keyword
    arguments live in ``DeltaBeliefParams``."""
    template = probe_template or (batch.extras or {}).get("answer_probe")
    if not template:
        raise ValueError("delta_belief probes the target answer: set method.probe_template (the benchmark has none)")
    beliefs = log_beliefs(batch, policy, template=template, agg=agg, targets=targets, final_segment=final_segment,
                          probe_scoring=probe_scoring)
    return delta_belief_credit(beliefs, batch, lam=lam, shaping=shaping, clip_min=clip_min, clip_max=clip_max, tau=tau,
                               final_segment=final_segment, missing_segments=missing_segments,
                               segment_penalty=segment_penalty, scale_by_std=scale_by_std, eps=eps)
