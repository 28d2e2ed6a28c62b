"""``loo``: leave-one-segment-out attribution (occlusion; Zeiler & Fergus, 2014, applied to
reasoning spans as in "causal credit" span masking, arXiv 2602.09331, and OAR's perturbation
importance, arXiv 2601.07408; docs/design/peer-methods.md section 7).

For completion i with reasoning context c_i (prompt + completion up to its answer segment, see
rredcot_cli/methods/_attribution.py) and segments S_1..S_K:

    a_{i,k} = s(c_i) - s(c_i without the tokens of S_k)

where s is the forced answer's log-probability (``score="logprob"``, default) or its probability
(``score="value"``) under the benchmark's ANSWER_PROBE, summed over the verified answers D (gold +
the group's correct answers). a > 0: the segment helps the answer. The final (answer) segment gets
a = 0 under ``answer_segment="last"``. Attributions become advantages by the shared INFERRED map
(GRPO advantage times group-normalised, sign-by-reward, mean-one segment weights; beta, w_min,
w_max), documented in _attribution.py.

Shapes: B completions, S = max segments; attributions (B, S) (NaN past K_i), token advantages
(B, T), exactly 0 on padding; segment_values are NaN (no state values).

Cost: no generation. One probe per (completion, segment, answer in D) plus one per (completion,
answer); a dropped-segment probe carries the rest of the reasoning after the segment, so probe
tokens total about K T / 2 per completion (T = completion length). All probes of a trace share
one packed forward (values/packing.py, block attention mask: the prefix before the dropped
segment is encoded once per row). The deleted segment shifts later positions down, exactly as if
the shortened text had been written.

Deviation: span masking in 2602.09331 weights tokens by the drop only; here the drop feeds the
shared weight map so every attribution method trains with the same advantage recipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._attribution import (
    AnswerSegment,
    Score,
    attribution_advantages,
    combine_candidates,
    eos_token_ids,
    reasoning_ends,
    resolve_template,
    segment_spans,
)
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.rredcot import answer_candidates
from rredcot_cli.values.packing import Probe, packed_probe_logprobs


@dataclass
class LOOParams:
    score: Score = "logprob"  # score of the forced answer: its log-probability, or its probability
    answer_segment: AnswerSegment = "last"  # last (final segment = the answer, never in the context) or none
    probe_template: Optional[str] = None  # forced-answer template with {answer}; null = the benchmark's
    beta: float = 1.0  # weight map (INFERRED): w = clip(1 + beta z, w_min, w_max), mean one
    w_min: float = 0.1  # lower clip of the weights
    w_max: float = 3.0  # upper clip of the weights
    eps: float = 1e-6  # added to the group's std of the attributions


# Meaningful range of each numeric parameter (checked when the config is composed).
LOO_RANGES = {
    "beta": ">= 0",
    "w_min": "(0, 1]",
    "w_max": ">= 1",
    "eps": "> 0",
}


def loo_attributions(full: torch.Tensor, dropped: torch.Tensor, num_segments: torch.Tensor) -> torch.Tensor:
    """a_{i,k} = full_i - dropped_{i,k}.

    full: (B,) score of the whole context; dropped: (B, S) score without segment k, NaN where the
    segment was not scored (it lies outside the context: a = 0). Returns (B, S), NaN past K_i."""
    a = full[:, None] - dropped
    a = torch.where(torch.isnan(dropped), torch.zeros_like(a), a)
    exists = torch.arange(dropped.shape[1])[None, :] < num_segments[:, None]
    return torch.where(exists, a, torch.full_like(a, float("nan")))


def loo_scores(model, prompts: list[list[int]], completions: list[list[int]], spans: list[list[tuple[int, int]]],
               ends: list[int], candidates, *, score: str, device: str = "cpu",
               stats: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of every full context and every context with one segment removed.

    Context of completion i: prompt + completion[:ends[i]]; segment k = completion[spans[i][k]]
    (clipped to the context; a segment outside it is not scored). candidates[i]: answer_probe
    Candidates (context tokens, scored answer tokens, utility). Returns full (B,) and dropped
    (B, S) with NaN for unscored segments. All probes go through one packed scorer call."""
    B = len(prompts)
    S = max((len(s) for s in spans), default=0)
    traces = [list(p) + list(c) for p, c in zip(prompts, completions)]
    probes, owners = [], []  # owner: (row, slot (-1 = full), candidate index)
    for i in range(B):
        P, end = len(prompts[i]), ends[i]
        contexts = [(-1, P + end, ())]
        for k, (start, stop) in enumerate(spans[i]):
            if start < end:
                contexts.append((k, P + start, tuple(completions[i][min(stop, end) : end])))
        for slot, prefix_len, suffix in contexts:
            for c, cand in enumerate(candidates[i]):
                probes.append(Probe(trace=i, prefix_len=prefix_len, tokens=suffix + cand.context + cand.answer,
                                    scored_from=len(suffix) + len(cand.context)))
                owners.append((i, slot, c))
    logprobs = packed_probe_logprobs(model, traces, probes, device=device, stats=stats)
    C = max((len(c) for c in candidates), default=0)
    lp = torch.full((B, S + 1, C), float("nan"))  # slot 0 = full context, 1 + k = without segment k
    for (i, slot, c), values in zip(owners, logprobs):
        lp[i, slot + 1, c] = values.sum()
    utilities = torch.zeros(B, 1, C)
    for i, cands in enumerate(candidates):
        utilities[i, 0, : len(cands)] = torch.tensor([cand.utility for cand in cands])
    scored = ~torch.isnan(lp[..., 0])
    combined = combine_candidates(torch.nan_to_num(lp, nan=0.0), utilities.expand_as(lp), score)
    combined = torch.where(scored, combined, torch.full_like(combined, float("nan")))
    return combined[:, 0], combined[:, 1:]


@register("loo", params=LOOParams, ranges=LOO_RANGES, needs=("policy",), forced_answer=lambda params: True)
def loo(batch: CreditBatch, *, policy, score: str, answer_segment: str, probe_template: Optional[str], beta: float,
        w_min: float, w_max: float, eps: float) -> Credit:
    """Leave-one-segment-out attributions of the forced answer, then the shared weight map.

    ``policy`` provides ``model``, ``tokenizer``, ``device``; ``batch.extras`` holds gold and
    predicted answers and the benchmark's ``answer_probe``."""
    template = resolve_template(batch, probe_template)
    spans = segment_spans(batch)
    ends = reasoning_ends(batch, eos_token_ids(policy), answer_segment)
    candidates = answer_candidates(batch, policy.tokenizer, template)
    stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
    full, dropped = loo_scores(policy.model, batch.prompt_token_ids, batch.completion_token_ids, spans, ends,
                               candidates, score=score, device=policy.device, stats=stats)
    S = batch.max_segments
    attributions = loo_attributions(full, dropped[:, :S], batch.num_segments)
    return attribution_advantages(attributions, batch, beta=beta, w_min=w_min, w_max=w_max, eps=eps)
