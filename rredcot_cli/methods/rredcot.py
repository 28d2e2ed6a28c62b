"""RREDCoT: segment-level reward redistribution from the model's own value estimates
(Ielanskyi, Schweighofer, Aichberger, Hochreiter, 2026; RUDDER, Arjona-Medina et al., 2019).

Segment k of completion i earns the change in the estimated chance of a correct answer:

    r_k = V(S_k) - V(S_{k-1}),  V(S_K) = R (observed reward),  V(S_0) = group mean reward
    (or the estimator at the empty prefix),  so  sum_k r_k = R - V(S_0)  exactly.

V comes from a registered value estimator (rredcot_cli/values/registry.py: ``answer_probe``,
``answer_share``, ``suffix_is``), none of which generates, and none of which sees the trace's own
outcome: V(S_i,k) is estimated from the *other* members of the group (their continuations, or their
answers), so flipping R_i moves none of trace i's values (tests/values/test_value_leak.py). Before
issue 37, ``suffix_is`` counted the trace's own next segment (weight 1 on-policy, utility R_i) and on
real model text, where other traces' wording gets likelihood ratios near 0, its V(S_1) was the own
reward for 86 % of SmolLM2's multi-line answers: "GRPO on the first segment, nothing after".

The default estimator follows the model (``method.value`` = ``model.value_estimator``), chosen by the
judge against two controls that know nothing (V = own reward, V = the prompt's baseline), on inner
boundaries and within completions of one reward (docs/studies/credit-quality.md, issue 37):
  answer_probe  real models (every HF/GGUF model): on SmolLM2 `arith` it ranks inner values within one
                reward at rho 0.41 [0.08, 0.74] over 5 batches, where the controls score 0.00 and
                0.02, while leave-one-out ``suffix_is`` scores about 0 (foreign suffixes are
                implausible after another trace's wording, so it has nothing to weigh). On
                SmolLM2's multi-line ``arith_multiline`` (15 batches, a plan committed first) it is
                the one estimator that beats both controls on inner boundaries on rank and on
                squared error (rho +0.18 [0.12, 0.24] and MSE -0.070 [-0.089, -0.052] against the
                outcome copy; also before the answer line alone, where no verdict helps).
  suffix_is     the embedded chain models (``model=tiny``, ``tiny-chain-verbose``), whose group mates
                write the same step lines token for token: on R1 it ranks inner values within one
                reward at rho 0.47 and finds the first wrong step 0.96 of the time (chance 0.12),
                while a forced answer mid-chain is a guess there.
``suffix_is`` uses ordinary importance sampling by default (the paper's estimator, whose bias is
non-positive): with the own suffix gone, self-normalised weights would hand the foreign rewards on
whatever their plausibility (a wrong chain whose mates are all right would be valued 1 at every
step); ordinary weights let implausible suffixes pull V towards 0.
The paper's advantage rule is not public; the three documented candidates are options
(docs/design/rredcot-method.md section 6), with sigma = std of all segment rewards of the group:
  immediate     A_t = r_k(t) / sigma                       (RUDDER: no reward-to-go needed)
  reward_to_go  A_t = sum_{j >= k(t)} (r_j - mean) / sigma (DeepSeekMath process supervision)
  mixed         A_t = A_GRPO + mix_lambda * r_k(t) / sigma (keeps the outcome signal)
RUDDER itself trains on the redistributed rewards' returns under PPO; with an optimal
redistribution the expected future reward is 0, so the immediate reward is the return's only
informative part, which is why ``immediate`` is the default.
Deviation from the paper, whose values are all the model's own estimates: a prefix whose outcome
the benchmark's grading has already fixed (``benchmarks.base.decided_outcome``: on the synthetic
benchmarks and under a jsonl benchmark's ``answer_line`` extractor, e.g. ``arith_multiline``, a
prefix holding the complete first ``Answer:`` line) is valued at the verifier's
verdict on the prefix text against the gold answer, whatever the estimator says
(``batch.extras["decided_values"]``, filled by ``pipeline.credit_batch``). The outcome is then
released on the segment that writes the graded answer, and the text after it (chain_tail's free
Notes) gets exactly zero credit, as the Monte Carlo reference gives it; no estimator knew that the
answer is final, so each released the outcome over the tail instead
(results/where-credit-pays/B-embedded-headroom). The verdict is computed from text and gold answer,
never from the trace's reward, so no value follows the own reward. Benchmarks that declare no
decided outcomes (last-answer grading) are unaffected.
Segment rewards are clipped to [-clip_reward, clip_reward] for the advantage only (0 = off); the
credits written to artifacts are the unclipped r_k, so the telescoping sum holds for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods.base import Credit, CreditBatch, pool_mean_std
from rredcot_cli.methods.grpo import group_mean_std, grpo_advantage
from rredcot_cli.values.answer_probe import Candidate, probe_tokens
from rredcot_cli.values.packing import value_stats
from rredcot_cli.values.registry import ValueSettings, get_value_estimator, value_estimator_names

AdvantageRule = Literal["immediate", "reward_to_go", "mixed"]  # the module docstring says each


@dataclass
class RREDCoTParams:
    # Estimator of V after each segment, a registered one (rredcot_cli/values/registry.py); its
    # config defaults to the model preset's choice, model.value_estimator (module docstring).
    value: str = "answer_probe"
    advantage: AdvantageRule = "immediate"  # how segment rewards become token advantages (module docstring)
    mix_lambda: float = 1.0  # advantage=mixed: weight of the segment term added to GRPO's
    baseline: Literal["group_mean", "estimator"] = "group_mean"  # V(S_0): the group's mean reward, or the estimator's
    clip_reward: float = 1.0  # segment rewards clipped to [-clip_reward, clip_reward] for the advantage; 0 = off
    eps: float = 1e-6  # added to the group's std of segment rewards
    # answer_probe: forced-answer template with {answer} (and {eos}); null = the benchmark's.
    probe_template: Optional[str] = None
    # suffix_is options (docs/design/rredcot-method.md section 4.2)
    is_boundaries: Literal["matched", "all"] = "matched"  # suffixes cut at the same segment index k, or at every boundary
    # Divide by the sum of the importance weights instead of their number. Off: ordinary IS, whose
    # implausible foreign suffixes pull V towards 0 (the paper's non-positive bias; values/suffix_is.py).
    is_self_normalised: bool = False
    # Length of the likelihood ratio, in is_window_unit; 0 = the whole suffix. One segment (one
    # step line) whatever its length: 16 tokens, the default before, localise as well on `chain`
    # but at chance on `chain_verbose`'s 70-token lines (docs/studies/credit-quality.md).
    is_window: int = 1
    is_window_unit: Literal["segments", "tokens"] = "segments"  # unit of is_window
    is_clip: float = 20.0  # max importance weight; 0 = no clipping
    # How probes reuse their prefix: kv_cache (encode each trace once, probes read its keys and
    # values), packed (probes appended to the trace in one row with a block attention mask), or
    # auto: packed for answer_probe's few short probes, kv_cache for suffix_is's many (measured in
    # docs/studies/rredcot-value-cost.md).
    probe_scoring: Literal["auto", "kv_cache", "packed"] = "auto"


# Meaningful range of each numeric parameter (checked when the config is composed).
RREDCOT_RANGES = {
    "mix_lambda": ">= 0",
    "clip_reward": ">= 0; 0 turns it off",
    "eps": "> 0",
    "is_window": ">= 0; 0 is the whole suffix",
    "is_clip": ">= 0; 0 turns it off",
}


def segment_rewards(values: torch.Tensor, num_segments: torch.Tensor) -> torch.Tensor:
    """values (B, S+1) holding V(S_0..S_K) -> r (B, S) with r_k = V_k - V_{k-1}, NaN past K_i."""
    r = values[:, 1:] - values[:, :-1]
    exists = torch.arange(r.shape[1])[None, :] < num_segments[:, None]
    return torch.where(exists, r, torch.full_like(r, float("nan")))


def _group_stats(r: torch.Tensor, group_ids: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std (+eps) of the existing segment rewards of each completion's group; (B,) each.
    A group with a single segment reward gets std 1; all-equal segment rewards get their common
    value exactly and std 0 + eps (``base.pool_mean_std``)."""
    means = torch.zeros(r.shape[0])
    stds = torch.ones(r.shape[0])
    for g in group_ids.unique():
        rows = group_ids == g
        vals = r[rows][~torch.isnan(r[rows])]
        if vals.numel():
            mean, std = pool_mean_std(vals)
            means[rows] = mean
            if vals.numel() > 1:
                stds[rows] = std + eps
    return means, stds


def redistribute(
    values: torch.Tensor,
    batch: CreditBatch,
    *,
    advantage: str,
    mix_lambda: float,
    clip_reward: float,
    eps: float,
) -> Credit:
    """Segment rewards and token advantages from state values.

    values: (B, S+1), column 0 = V(S_0), column k = V(S_k) for k <= K_i, where V(S_K_i) must be the
    observed reward; columns past K_i are ignored. Returns Credit with segment_values = V(S_1..S_K),
    segment_credits = r_k and token advantages per ``advantage``.
    """
    if advantage not in get_args(AdvantageRule):  # mc and direct callers reach this unchecked
        raise ValueError(f"unknown advantage rule {advantage!r}; valid: {', '.join(get_args(AdvantageRule))}")
    S = batch.max_segments
    values = values[:, : S + 1].to(torch.float32)
    r = segment_rewards(values, batch.num_segments)
    r_used = r.clamp(-clip_reward, clip_reward) if clip_reward > 0 else r
    mean, std = _group_stats(r_used, batch.group_ids, eps)
    if advantage == "immediate":
        seg_adv = r_used / std[:, None]
    elif advantage == "reward_to_go":
        normalised = torch.nan_to_num((r_used - mean[:, None]) / std[:, None], nan=0.0)
        seg_adv = normalised.flip(1).cumsum(1).flip(1)
    else:
        outcome = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std=True, eps=eps)
        seg_adv = outcome[:, None] + mix_lambda * r_used / std[:, None]
    seg_adv = torch.nan_to_num(seg_adv, nan=0.0)
    mask = batch.token_mask
    index = batch.segment_ids.clamp(min=0)
    tokens = torch.gather(seg_adv, 1, index) * mask if S else torch.zeros_like(mask, dtype=torch.float32)
    exists = torch.arange(S)[None, :] < batch.num_segments[:, None]
    seg_values = torch.where(exists, values[:, 1:], torch.full_like(r, float("nan")))
    return Credit(token_advantages=tokens.to(torch.float32), segment_values=seg_values, segment_credits=r)


def segment_ends(batch: CreditBatch) -> list[list[int]]:
    """Completion-token offset where each segment ends: (end of S_1, ..., end of S_K)."""
    ends = []
    for i in range(batch.segment_ids.shape[0]):
        ids = batch.segment_ids[i]
        K = int(batch.num_segments[i])
        ends.append([int((ids <= k).logical_and(ids >= 0).sum()) for k in range(K)])
    return ends


@register("rredcot", params=RREDCoTParams, ranges=RREDCOT_RANGES, needs=("policy",),
          forced_answer=lambda params: get_value_estimator(params.get("value", "answer_probe")).forced_answer,
          registry_choices={"value": value_estimator_names})
def rredcot(batch: CreditBatch, *, policy, value: str, advantage: str, mix_lambda: float, baseline: str,
            clip_reward: float, eps: float, probe_template: Optional[str], is_boundaries: str,
            is_self_normalised: bool, is_window: int, is_window_unit: str, is_clip: float,
            probe_scoring: str = "auto") -> Credit:
    """Estimate V after every segment boundary with ``value``, then redistribute.

    ``policy`` provides ``model``, ``tokenizer`` and ``device`` (the current policy scores its own
    prefixes). ``batch.extras`` must hold ``gold_answers``, ``pred_answers`` and, for
    answer_probe without ``probe_template``, ``answer_probe`` (the benchmark's template); where
    it holds ``decided_values`` (B, S), a non-NaN entry replaces the estimate at that boundary
    (the module docstring's decided-prefix rule).
    Defaults of the keyword arguments live in ``RREDCoTParams``.

    A boundary the estimator has no evidence for (NaN) keeps the previous value, so its segment
    gets zero credit; ``Credit.segment_value_covered`` and ``value_stats["value_boundaries"]`` /
    ``["value_covered"]`` say how many there were."""
    estimator = get_value_estimator(value)
    B, S = batch.segment_ids.shape[0], batch.max_segments
    ends = segment_ends(batch)
    # Prefixes to estimate: S_0 (completion offset 0) when the baseline is the estimator, then
    # the ends of S_1..S_{K-1}; S_K is the observed reward.
    offsets = [([0] if baseline == "estimator" else []) + e[:-1] for e in ends]
    settings = ValueSettings(probe_template=probe_template, matched=is_boundaries == "matched", window=is_window,
                             window_unit=is_window_unit, self_normalised=is_self_normalised, clip=is_clip,
                             probe_scoring=probe_scoring)
    estimates = estimator.fn(batch, policy, offsets, settings)

    decided = (batch.extras or {}).get("decided_values")
    values = torch.full((B, S + 1), float("nan"))
    covered = torch.zeros(B, S, dtype=torch.bool)
    group_mean, _ = _group_mean(batch)
    for i in range(B):
        K = int(batch.num_segments[i])
        est = estimates[i]
        v0 = est[0] if baseline == "estimator" else group_mean[i]
        inner = est[1:] if baseline == "estimator" else est
        values[i, 0] = v0 if not torch.isnan(torch.as_tensor(v0)) else group_mean[i]
        values[i, 1:K] = inner
        if decided is not None:  # a prefix the verifier has already graded is worth its verdict
            known = ~torch.isnan(decided[i, : K - 1])
            values[i, 1:K][known] = decided[i, : K - 1][known]
        covered[i, : K - 1] = ~torch.isnan(values[i, 1:K])
        covered[i, K - 1] = K > 0  # V(S_K) is the observed reward
        values[i, K] = batch.rewards[i]
        # A prefix the estimator has no evidence for keeps the previous value (zero credit).
        for k in range(1, K):
            if torch.isnan(values[i, k]):
                values[i, k] = values[i, k - 1]
    stats = value_stats(batch)
    if stats is not None:
        inner_boundaries = int((batch.num_segments - 1).clamp(min=0).sum())
        stats["value_boundaries"] = stats.get("value_boundaries", 0) + inner_boundaries
        stats["value_covered"] = stats.get("value_covered", 0) + int(covered.sum()) - int((batch.num_segments > 0).sum())
    credit = redistribute(values, batch, advantage=advantage, mix_lambda=mix_lambda, clip_reward=clip_reward, eps=eps)
    credit.segment_value_covered = covered
    return credit


def _group_mean(batch: CreditBatch) -> tuple[torch.Tensor, torch.Tensor]:
    return group_mean_std(batch.rewards, batch.group_ids)


def answer_candidates(batch: CreditBatch, tokenizer, template: str):
    """D per trace: the gold answer plus the distinct answers of the group's correct completions,
    each with utility 1 (0/1 rewards: wrong answers would add nothing to V)."""
    gold = batch.extras["gold_answers"]
    preds = batch.extras["pred_answers"]
    per_group: dict[int, dict[str, float]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        answers = per_group.setdefault(g, {})
        answers.setdefault(str(gold[i]).strip(), 1.0)
        if preds[i] is not None and float(batch.rewards[i]) > 0.5:
            answers.setdefault(str(preds[i]).strip(), float(batch.rewards[i]))
    out = []
    for g in batch.group_ids.tolist():
        cands = []
        for answer, utility in per_group[g].items():
            context, scored = probe_tokens(tokenizer, template, answer)
            cands.append(Candidate(context=context, answer=scored, utility=utility))
        out.append(cands)
    return out
