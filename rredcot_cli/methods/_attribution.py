"""What the attribution methods (``loo``, ``gradient``) share: the answer score they attribute,
the context it is scored after, and the map from per-segment attributions to advantages.

Answer score (the quantity attributed). After a context c the benchmark's forced-answer probe
(``ANSWER_PROBE``, e.g. "Answer: {answer}{eos}") is appended for every answer y in D (the gold
answer and the group's verified answers, utility U(y); as RREDCoT's answer_probe):

    score="logprob":  s(c) = log sum_{y in D} U(y) pi(y | c, probe)      (answer log-probability)
    score="value":    s(c) =     sum_{y in D} U(y) pi(y | c, probe)      (answer_probe value)

Context. ``answer_segment="last"`` (default) treats the final segment as the written answer: it is
left out of every context, so the probe asks for the answer after the reasoning instead of after
the model already wrote one (which it would mostly copy), and the final segment's attribution is
0. ``answer_segment="none"`` scores after the whole completion (trailing EOS removed).

Advantages (INFERRED; docs/design/peer-methods.md gives no rule for attribution baselines, so this follows its
section 0/9 recipe for token weights, the form OAR and CSCR use). Attributions a_{i,k} say how much
segment k raises the verified answer's score. With the GRPO outcome advantage A_i:

    rho_{i,k} = sign(A_i) a_{i,k}        responsibility for the outcome ("sign by reward": a
                                          correct trace credits segments that support the answer,
                                          a wrong one blames segments that work against it)
    z_{i,k}   = (rho_{i,k} - mean_g rho) / (std_g rho + eps)    over all segments of the group
    w~_{i,k}  = clip(1 + beta z_{i,k}, w_min, w_max)
    w_{i,t}   = w~_{i,k(t)} T_i / sum_t w~_{i,k(t)}              mean one over the completion's tokens
    A_{i,t}   = A_i w_{i,t}

so each completion keeps GRPO's total advantage and sign, and attribution only moves it between
segments. Groups with A = 0 (all right or all wrong) get 0, as in GRPO.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from rredcot_cli.methods.base import Credit, CreditBatch, pool_mean_std
from rredcot_cli.methods.grpo import grpo_advantage

# The options loo and gradient share, checked when the config is composed (their Literal fields).
Score = Literal["logprob", "value"]  # s(c) above: the answer's log-probability, or its probability
AnswerSegment = Literal["last", "none"]  # last: the final segment is the answer, never in the context


def segment_spans(batch: CreditBatch) -> list[list[tuple[int, int]]]:
    """Half-open completion-token spans of every segment of every completion."""
    spans = []
    for i in range(batch.segment_ids.shape[0]):
        ids = batch.segment_ids[i]
        row, start = [], 0
        for k in range(int(batch.num_segments[i])):
            end = int(((ids <= k) & (ids >= 0)).sum())
            row.append((start, end))
            start = end
        spans.append(row)
    return spans


def reasoning_ends(batch: CreditBatch, eos_ids: list[int], answer_segment: str) -> list[int]:
    """Completion offset where the attributed context ends, per completion: the start of the final
    segment (``last``), or the completion length without trailing EOS tokens (``none``)."""
    ends = []
    for i, spans in enumerate(segment_spans(batch)):
        if answer_segment == "last":
            ends.append(spans[-1][0])
        else:
            ids = batch.completion_token_ids[i]
            n = len(ids)
            while n and ids[n - 1] in eos_ids:
                n -= 1
            ends.append(n)
    return ends


def combine_candidates(logprobs: torch.Tensor, utilities: torch.Tensor, score: str) -> torch.Tensor:
    """Answer score from candidate answer log-probs.

    logprobs, utilities: (..., C) (summed log-prob of each candidate answer; its utility > 0,
    or 0 for padding candidates) -> (...) log sum U exp(lp) for ``logprob``, sum U exp(lp) for
    ``value``."""
    if score == "value":
        return (utilities * logprobs.exp()).sum(-1)
    log_u = torch.where(utilities > 0, utilities.clamp(min=1e-30).log(), torch.full_like(utilities, -math.inf))
    return torch.logsumexp(logprobs + log_u, dim=-1)


def candidate_weights(logprobs: torch.Tensor, utilities: torch.Tensor, score: str) -> torch.Tensor:
    """d score / d logprob_c, same shape as ``logprobs``: softmax(lp + log U) for ``logprob``,
    U exp(lp) for ``value`` (chain rule for gradients computed per candidate)."""
    if score == "value":
        return utilities * logprobs.exp()
    log_u = torch.where(utilities > 0, utilities.clamp(min=1e-30).log(), torch.full_like(utilities, -math.inf))
    return torch.softmax(logprobs + log_u, dim=-1)


def segment_sums(token_values: torch.Tensor, segment_ids: torch.Tensor, num_segments: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token values -> (B, S) sums per segment (padding ignored), NaN past K_i."""
    B = token_values.shape[0]
    S = int(num_segments.max()) if B else 0
    sums = torch.zeros(B, S + 1, dtype=torch.float32)
    index = torch.where(segment_ids >= 0, segment_ids, torch.full_like(segment_ids, S))
    sums.scatter_add_(1, index, token_values.to(torch.float32))
    sums = sums[:, :S]
    exists = torch.arange(S)[None, :] < num_segments[:, None]
    return torch.where(exists, sums, torch.full_like(sums, float("nan")))


def _group_standardise(x: torch.Tensor, group_ids: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, S) with NaN for missing segments -> z-scores over each group's existing entries
    (std: unbiased, 1 when the group has a single entry; all-equal entries give exactly 0,
    ``base.pool_mean_std``); NaN stays NaN."""
    z = torch.full_like(x, float("nan"))
    for g in group_ids.unique():
        rows = group_ids == g
        vals = x[rows]
        present = vals[~torch.isnan(vals)]
        if present.numel() == 0:
            continue
        mean, std = pool_mean_std(present)
        std = std if present.numel() > 1 else torch.tensor(1.0)
        z[rows] = (vals - mean) / (std + eps)
    return z


def attribution_advantages(attributions: torch.Tensor, batch: CreditBatch, *, beta: float, w_min: float,
                           w_max: float, eps: float) -> Credit:
    """Token advantages A_i w_{i,t} from segment attributions (module docstring).

    attributions: (B, S) float, NaN past K_i. Returns Credit with segment_credits = attributions,
    segment_values = NaN (no state values), token_advantages (B, T), exactly 0 on padding."""
    S = batch.max_segments
    attributions = attributions[:, :S].to(torch.float32)
    outcome = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std=True, eps=eps)
    rho = torch.sign(outcome)[:, None] * attributions
    z = torch.nan_to_num(_group_standardise(rho, batch.group_ids, eps), nan=0.0)
    w_seg = (1.0 + beta * z).clamp(w_min, w_max)
    mask = batch.token_mask
    if S:
        w_tok = torch.gather(w_seg, 1, batch.segment_ids.clamp(min=0)) * mask
    else:
        w_tok = torch.zeros(mask.shape)
    # Mean one over each completion's tokens: the completion's total advantage stays T_i A_i.
    w_tok = w_tok * mask.sum(1, keepdim=True) / w_tok.sum(1, keepdim=True).clamp(min=1e-12)
    tokens = (outcome[:, None] * w_tok * mask).to(torch.float32)
    nan = torch.full_like(attributions, float("nan"))
    return Credit(token_advantages=tokens, segment_values=nan, segment_credits=attributions)


def eos_token_ids(policy) -> list[int]:
    eos = getattr(policy.model.generation_config, "eos_token_id", None)
    return [policy.tokenizer.eos_token_id] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])


def resolve_template(batch: CreditBatch, override) -> str:
    """The forced-answer template: the method's override or the benchmark's ANSWER_PROBE."""
    template = override or (batch.extras or {}).get("answer_probe")
    if not template:
        raise ValueError("attribution methods score a forced answer: set method.probe_template "
                         "(the benchmark has none)")
    return template
