"""``gradient``: gradient x input (Shrikumar et al., 2016; Denil et al., 2014) or integrated
gradients (Sundararajan et al., ICML 2017, arXiv 1703.01365) of the forced answer's score with
respect to the completion's token embeddings, summed per segment (OAR's saliency variant,
arXiv 2601.07408; docs/design/peer-methods.md section 7).

For completion i with reasoning context c_i (prompt + completion up to its answer segment, see
rredcot_cli/methods/_attribution.py), token embeddings e_t and answer score s (log-probability of
the benchmark's ANSWER_PROBE answers D, or their probability with ``score="value"``):

    gradient x input (ig_steps = 0):  a_t = e_t . d s / d x_t |_{x = e}
    integrated gradients (m steps):   a_t = e_t . (1/m) sum_{j<m} d s / d x_t |_{x = alpha_j e},
                                      alpha_j = (j + 1/2) / m   (midpoint rule)
    a_{i,k} = sum_{t in S_k} a_t

Only completion tokens of the context are scaled; prompt and probe embeddings stay as they are.
IG's baseline is the zero embedding (INFERRED: the IG paper leaves the baseline to the user; zero is
its text-model example), so sum_t a_t ~ s(c) - s(c with completion embeddings zeroed)
(completeness, exact as m grows). On Llama-style models the path is rough near the zero baseline
(RMSNorm rescales tiny embeddings to full size), so the midpoint sum converges slowly: on the
embedded model one trace's completeness gap (6.97 nats) was matched to 7.29 / 6.39 / 7.10 / 6.98 by
m = 8 / 32 / 128 / 512; use m >= 128 for faithful IG, or gradient x input (m = 0), whose
gradients match finite differences (tests/values/test_peer_values.py). The final (answer) segment gets 0 under
``answer_segment="last"``. Attributions become advantages by the shared INFERRED map (GRPO
advantage times group-normalised, sign-by-reward, mean-one segment weights), _attribution.py.

Shapes: B completions, T tokens, S = max segments; attributions (B, S) (NaN past K_i), token
advantages (B, T) with exactly 0 on padding; segment_values are NaN.

Cost: no generation; per completion and answer candidate, (1 or m) forward+backward passes over
prompt + context + probe, i.e. about 3 F each (F = one scoring forward); gradients are taken with
respect to the input embeddings only (no parameter gradients are stored).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._attribution import (
    AnswerSegment,
    Score,
    attribution_advantages,
    candidate_weights,
    eos_token_ids,
    reasoning_ends,
    resolve_template,
    segment_sums,
)
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.rredcot import answer_candidates


@dataclass
class GradientParams:
    ig_steps: int = 0  # 0 = gradient x input; m > 0 = integrated gradients with m midpoint steps
    score: Score = "logprob"  # score of the forced answer: its log-probability, or its probability
    answer_segment: AnswerSegment = "last"  # last (final segment = the answer, never in the context) or none
    probe_template: Optional[str] = None  # forced-answer template with {answer}; null = the benchmark's
    beta: float = 1.0  # weight map (INFERRED): w = clip(1 + beta z, w_min, w_max), mean one
    w_min: float = 0.1  # lower clip of the weights
    w_max: float = 3.0  # upper clip of the weights
    eps: float = 1e-6  # added to the group's std of the attributions
    rows_per_forward: int = 16  # sequences per forward/backward


# Meaningful range of each numeric parameter (checked when the config is composed).
GRADIENT_RANGES = {
    "ig_steps": ">= 0; 0 is gradient x input",
    "beta": ">= 0",
    "w_min": "(0, 1]",
    "w_max": ">= 1",
    "eps": "> 0",
    "rows_per_forward": ">= 1",
}


@dataclass(frozen=True)
class GradRow:
    ids: tuple[int, ...]  # prompt + context + probe context + answer
    attr_start: int  # embeddings ids[attr_start:attr_end] are scaled and attributed
    attr_end: int
    answer_from: int  # log-probs of ids[answer_from:] are summed
    alpha: float  # scale of the attributed embeddings (1 = the real input)


def embedding_grad_products(model: torch.nn.Module, rows: list[GradRow], *, device: str = "cpu",
                            scales: Optional[list[torch.Tensor]] = None, stats: dict | None = None
                            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """For each row: lp = sum of log-probs of ids[answer_from:] with the attributed embeddings
    e_t replaced by x_t = alpha e_t (or by scales[r][t - attr_start] e_t when ``scales`` is
    given), and the products e_t . d lp / d x_t over the attributed positions.

    Rows run as one left-padded batch. Returns lp (R,) and per row a float32 tensor
    (attr_end - attr_start,)."""
    embed = model.get_input_embeddings()
    width = max(len(r.ids) for r in rows)
    pad = [width - len(r.ids) for r in rows]
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    scale = torch.ones(len(rows), width, dtype=torch.float64)
    for r, row in enumerate(rows):
        input_ids[r, pad[r] :] = torch.tensor(row.ids)
        attention[r, pad[r] :] = 1
        a0, a1 = pad[r] + row.attr_start, pad[r] + row.attr_end
        scale[r, a0:a1] = row.alpha if scales is None else scales[r].to(scale.dtype)
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    # Token j is predicted at position j - 1, and only the answers' tokens are scored: the logits
    # start at the earliest answer's first prediction (rows are left-padded, answers at the end),
    # so the LM head and softmax skip the contexts (at a 152k vocabulary, their (rows, width, V)
    # logits and gradients would dwarf the rest).
    first = min(pad[r] + row.answer_from - 1 for r, row in enumerate(rows))
    keep_last = {"logits_to_keep": width - first} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.enable_grad():
        e = embed(input_ids).detach()
        x = (e * scale.to(device=device, dtype=e.dtype)[..., None]).requires_grad_(True)
        logits = model(inputs_embeds=x, attention_mask=attention, position_ids=positions, use_cache=False,
                       **keep_last).logits
        logits = logits[:, logits.shape[1] - (width - first) : -1]  # positions first .. width - 2
        # At least float32 for the softmax (half-precision models), float64 models stay float64.
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, first + 1 :, None])[..., 0]
        keep = torch.zeros_like(logprobs, dtype=torch.bool)
        for r, row in enumerate(rows):
            keep[r, pad[r] + row.answer_from - 1 - first :] = True
        lp = (logprobs * keep).sum(1)
        (grad,) = torch.autograd.grad(lp.sum(), x)  # rows are independent: row r's grad is d lp_r / d x_r
    products = (grad.float() * e.float()).sum(-1).detach().cpu()
    if stats is not None:
        stats["forward_tokens"] = stats.get("forward_tokens", 0) + len(rows) * width
        stats["backward_tokens"] = stats.get("backward_tokens", 0) + len(rows) * width
    per_row = [products[r, pad[r] + row.attr_start : pad[r] + row.attr_end] for r, row in enumerate(rows)]
    return lp.detach().cpu(), per_row


def ig_alphas(steps: int) -> list[float]:
    """[1.0] for gradient x input; midpoints (j + 1/2)/m for integrated gradients."""
    return [1.0] if steps <= 0 else [(j + 0.5) / steps for j in range(steps)]


def combine_token_attributions(lp: torch.Tensor, products: torch.Tensor, utilities: torch.Tensor,
                               score: str) -> torch.Tensor:
    """Token attributions of the answer score from per-candidate, per-alpha pieces.

    lp: (A, C) answer log-probs at each alpha and candidate; products: (A, C, L) e_t . d lp_c / d x_t;
    utilities: (C,). By the chain rule d s / d x = sum_c (d s / d lp_c) d lp_c / d x, then the mean
    over alphas (IG's Riemann sum; A = 1 for gradient x input). Returns (L,)."""
    weights = candidate_weights(lp, utilities.expand_as(lp), score)  # (A, C)
    return (weights[..., None] * products).sum(1).mean(0)


def gradient_attributions(model, prompts: list[list[int]], completions: list[list[int]], ends: list[int],
                          candidates, *, score: str, ig_steps: int, device: str = "cpu", rows_per_forward: int = 16,
                          stats: dict | None = None) -> list[torch.Tensor]:
    """Per completion, attributions of its context tokens completion[:ends[i]], (ends[i],)."""
    alphas = ig_alphas(ig_steps)
    rows, owners = [], []  # owner: (completion, alpha index, candidate index)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        if ends[i] == 0:
            continue  # nothing to attribute
        context = tuple(prompt) + tuple(completion[: ends[i]])
        for a, alpha in enumerate(alphas):
            for c, cand in enumerate(candidates[i]):
                ids = context + cand.context + cand.answer
                rows.append(GradRow(ids=ids, attr_start=len(prompt), attr_end=len(context),
                                    answer_from=len(context) + len(cand.context), alpha=alpha))
                owners.append((i, a, c))
    order = sorted(range(len(rows)), key=lambda r: len(rows[r].ids))  # similar lengths share a batch
    results: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for start in range(0, len(order), max(1, rows_per_forward)):
        chunk = order[start : start + rows_per_forward]
        lp, per_row = embedding_grad_products(model, [rows[r] for r in chunk], device=device, stats=stats)
        for j, r in enumerate(chunk):
            results[r] = (lp[j], per_row[j])
    out = [torch.zeros(ends[i]) for i in range(len(prompts))]
    by_completion: dict[int, list[int]] = {}
    for r, (i, _, _) in enumerate(owners):
        by_completion.setdefault(i, []).append(r)
    for i, rs in by_completion.items():
        C = len(candidates[i])
        lp = torch.zeros(len(alphas), C)
        products = torch.zeros(len(alphas), C, ends[i])
        for r in rs:
            _, a, c = owners[r]
            lp[a, c], products[a, c] = results[r]
        utilities = torch.tensor([cand.utility for cand in candidates[i]])
        out[i] = combine_token_attributions(lp, products, utilities, score)
    return out


@register("gradient", params=GradientParams, ranges=GRADIENT_RANGES, needs=("policy",),
          forced_answer=lambda params: True)
def gradient(batch: CreditBatch, *, policy, ig_steps: int, score: str, answer_segment: str,
             probe_template: Optional[str], beta: float, w_min: float, w_max: float, eps: float,
             rows_per_forward: int) -> Credit:
    """Gradient x input (or IG) attributions of the forced answer, summed per segment, then the
    shared weight map. ``policy`` provides ``model``, ``tokenizer``, ``device``."""
    if ig_steps < 0:
        raise ValueError(f"ig_steps must be >= 0 (0 = gradient x input), got {ig_steps}")
    template = resolve_template(batch, probe_template)
    ends = reasoning_ends(batch, eos_token_ids(policy), answer_segment)
    candidates = answer_candidates(batch, policy.tokenizer, template)
    stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
    per_token = gradient_attributions(policy.model, batch.prompt_token_ids, batch.completion_token_ids, ends,
                                      candidates, score=score, ig_steps=ig_steps, device=policy.device,
                                      rows_per_forward=rows_per_forward, stats=stats)
    token_attr = torch.zeros(batch.segment_ids.shape, dtype=torch.float32)
    for i, attr in enumerate(per_token):
        token_attr[i, : attr.shape[0]] = attr
    attributions = segment_sums(token_attr, batch.segment_ids, batch.num_segments)
    return attribution_advantages(attributions, batch, beta=beta, w_min=w_min, w_max=w_max, eps=eps)
