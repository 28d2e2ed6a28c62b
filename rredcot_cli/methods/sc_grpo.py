"""SC-GRPO: Self-Conditioned GRPO (Shan, Guo, Cheng, Liu, Zhu, Wang, Yao, Lin, Wang, Huang, 2026,
"Learning from Own Solutions: Self-Conditioned Credit Assignment for RLVR", arXiv 2606.18810).

The abstract and summaries [ABS]: the self-teacher is the same model conditioned on one of its
own verified (correct) completions; conditioning induces a per-token KL between the original and
the conditioned next-token distributions; that KL is used as a multiplicative weight on the GRPO
advantage, not as a distillation loss (distilling towards several verified solutions would pull
towards an infeasible average of them). The full text was not available: the forms below are
INFERRED (docs/design/peer-methods.md section 3), and every inferred choice is a knob.

    A_i        host advantage: GRPO (``scale_by_std``) or Dr. GRPO
    y_ref      a verified completion of the same group other than y_i (``ref_pick``: shortest or
               random); none (y_i is the group's only correct one) -> w = 1. The paper's buffer
               of past correct completions is not implemented.
    c_T        x + ``header`` + y_ref (its end-of-sequence token dropped, cut to
               ``max_ref_tokens``) + ``footer``, appended to the prompt tokens           INFERRED
    k_t        KL(pi(.|x, y_<t) || pi(.|c_T, y_<t))  (``kl_dir=rev``, the spec's formula, i.e.
               KL(student || teacher); ``fwd``: KL(teacher || student)); over the full
               vocabulary or the teacher's ``top_k`` tokens, both renormalised      INFERRED
    w_t        clip(k_t^gamma / mean_t k_t^gamma, w_min, w_max), then rescaled to mean 1   INFERRED
    A_{i,t} = A_i w_t   (high KL = tokens the verified solution changes = up-weighted)

Completions of groups with advantage 0 are not scored. Cost: +2F per scored completion (the
unconditioned pass is rerun for full distributions; the sampler keeps only the sampled token's
log-prob), one of them over a context |x| + |y_ref| longer; full-vocabulary log-softmax is taken
over ``kl_chunk`` positions at a time.
Shapes: student_logp, teacher_logp (B, T, V) -> k (B, T); k, mask (B, T) -> weights (B, T), mean
1 over each row's tokens, 0 on padding; Credit segment credits = mean token advantage per segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._rescore import completion_logits, encode, pad_id
from rredcot_cli.methods._token_weights import masked_mean, mean_one, padded, reweighted_credit
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.grpo import grpo_advantage

KLDirection = Literal["rev", "fwd"]
RefPick = Literal["shortest", "random"]


@dataclass
class SCGRPOParams:
    header: str = "\nHere is a verified solution:\n"  # put before y_ref in the teacher's context
    footer: str = "\nNow solve the problem yourself:\n"  # put after y_ref in the teacher's context
    ref_pick: RefPick = "shortest"  # which verified sibling completion is y_ref
    ref_seed: int = 0  # ref_pick=random: seed of the choice
    max_ref_tokens: int = 1024  # y_ref is cut to this many tokens (0 = whole)
    kl_dir: KLDirection = "rev"  # rev: KL(student || teacher), fwd: KL(teacher || student)
    top_k: int = 0  # 0 = full vocabulary; k = the teacher's top-k tokens, renormalised
    gamma: float = 1.0  # exponent of the KL in the weights: k_t^gamma
    w_min: float = 0.2  # lower clip of the weights
    w_max: float = 5.0  # upper clip of the weights
    scale_by_std: bool = True  # host advantage: GRPO (true) or Dr. GRPO (false)
    eps: float = 1e-6  # added to the group's reward std (host advantage)
    batch_size: int = 4  # completions per scoring forward (full logits are held per forward)
    kl_chunk: int = 1024  # positions per float32 log-softmax


# Meaningful range of each numeric parameter (checked when the config is composed).
SCGRPO_RANGES = {
    "ref_seed": ">= 0",
    "max_ref_tokens": ">= 0; 0 keeps the whole completion",
    "top_k": ">= 0; 0 is the full vocabulary",
    "gamma": "> 0",
    "w_min": "(0, 1]",
    "w_max": ">= 1",
    "eps": "> 0",
    "batch_size": ">= 1",
    "kl_chunk": ">= 1",
}


def token_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor, kl_dir: str = "rev",
             top_k: int = 0) -> torch.Tensor:
    """(..., V) log-distributions -> (...) KL per position. ``rev``: KL(student || teacher),
    ``fwd``: KL(teacher || student); with ``top_k`` > 0 both are restricted to the teacher's
    top-k tokens and renormalised there."""
    if kl_dir not in get_args(KLDirection):  # called directly, not only through a composed config
        raise ValueError(f"unknown kl_dir {kl_dir!r}; valid: {', '.join(get_args(KLDirection))}")
    s, t = student_logp.float(), teacher_logp.float()
    if top_k > 0:
        index = t.topk(min(top_k, t.shape[-1]), dim=-1).indices
        s, t = s.gather(-1, index), t.gather(-1, index)
        s, t = s - s.logsumexp(-1, keepdim=True), t - t.logsumexp(-1, keepdim=True)
    p, q = (s, t) if kl_dir == "rev" else (t, s)
    return (p.exp() * (p - q)).sum(-1)


def sc_grpo_weights(kl: torch.Tensor, mask: torch.Tensor, *, w_min: float, w_max: float,
                    gamma: float = 1.0) -> torch.Tensor:
    """(B, T) per-token KL -> (B, T) weights, mean 1 per row, 0 on padding. A row whose KL is 0
    everywhere gets weight 1 everywhere."""
    if not 0 < w_min <= 1 <= w_max:
        raise ValueError(f"sc_grpo needs 0 < w_min <= 1 <= w_max, got {w_min} and {w_max}")
    # KL is >= 0; rounding can leave tiny negatives, which a fractional gamma would turn into NaN.
    k = torch.where(mask, kl.clamp(min=0) ** gamma, torch.zeros_like(kl))
    w = (k / (masked_mean(k, mask) + 1e-6)).clamp(w_min, w_max)
    return mean_one(w, mask)


def pick_references(batch: CreditBatch, rows: list[int], ref_pick: str, ref_seed: int) -> dict[int, int]:
    """Row -> a verified (reward > 0.5) completion of its group other than itself; rows without
    one are left out."""
    if ref_pick not in get_args(RefPick):  # called directly, not only through a composed config
        raise ValueError(f"unknown ref_pick {ref_pick!r}; valid: {', '.join(get_args(RefPick))}")
    generator = torch.Generator().manual_seed(ref_seed)
    out = {}
    for i in rows:
        same_group = (batch.group_ids == batch.group_ids[i]) & (batch.rewards > 0.5)
        candidates = [j for j in same_group.nonzero().flatten().tolist() if j != i]
        if not candidates:
            continue
        if ref_pick == "shortest":
            out[i] = min(candidates, key=lambda j: (len(batch.completion_token_ids[j]), j))
        else:
            out[i] = candidates[int(torch.randint(len(candidates), (1,), generator=generator))]
    return out


def _reference_tokens(tokens: list[int], eos_id, max_ref_tokens: int) -> list[int]:
    tokens = list(tokens)
    if tokens and eos_id is not None and tokens[-1] == eos_id:
        tokens = tokens[:-1]  # an end-of-sequence mid-context would end the teacher's "document"
    return tokens[:max_ref_tokens] if max_ref_tokens > 0 else tokens


@torch.no_grad()
def conditioned_kl(model, tokenizer, prompts: list[list[int]], teacher_prompts: list[list[int]],
                   completions: list[list[int]], *, kl_dir: str, top_k: int, batch_size: int, kl_chunk: int,
                   stats: dict | None = None) -> list[torch.Tensor]:
    """Per completion token, KL between the next-token distributions after ``prompts`` and after
    ``teacher_prompts``; one (len(c),) float32 CPU tensor per row."""
    pad = pad_id(tokenizer)
    out: list[torch.Tensor] = []
    for start in range(0, len(prompts), max(1, batch_size)):
        end = start + max(1, batch_size)
        comps = completions[start:end]
        student = completion_logits(model, prompts[start:end], comps, pad)
        teacher = completion_logits(model, teacher_prompts[start:end], comps, pad)
        kl = torch.zeros(student.shape[:2])
        for t0 in range(0, student.shape[1], max(1, kl_chunk)):
            t1 = t0 + max(1, kl_chunk)
            s = torch.log_softmax(student[:, t0:t1].float(), dim=-1)
            t = torch.log_softmax(teacher[:, t0:t1].float(), dim=-1)
            kl[:, t0:t1] = token_kl(s, t, kl_dir, top_k).cpu()
        out.extend(kl[i, : len(c)] for i, c in enumerate(comps))
        if stats is not None:
            stats["forward_tokens"] = stats.get("forward_tokens", 0) + sum(
                len(p) + len(q) + 2 * len(c) for p, q, c in zip(prompts[start:end], teacher_prompts[start:end], comps))
    return out


@register("sc_grpo", params=SCGRPOParams, ranges=SCGRPO_RANGES, needs=("policy",))
def sc_grpo(batch: CreditBatch, *, policy, header: str, footer: str, ref_pick: str, ref_seed: int,
            max_ref_tokens: int, kl_dir: str, top_k: int, gamma: float, w_min: float, w_max: float,
            scale_by_std: bool, eps: float, batch_size: int, kl_chunk: int) -> Credit:
    """Host advantage reweighted by the KL a verified sibling completion induces; ``policy``
    (model, tokenizer) scores. Defaults of the keyword arguments live in ``SCGRPOParams``."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    mask = batch.token_mask
    weights = mask.to(torch.float32)
    tok = policy.tokenizer
    refs = pick_references(batch, (advantage != 0).nonzero().flatten().tolist(), ref_pick, ref_seed)
    rows = sorted(refs)
    if rows:
        head, tail = encode(tok, header), encode(tok, footer)
        prompts = [list(batch.prompt_token_ids[i]) for i in rows]
        teacher = [list(batch.prompt_token_ids[i]) + head
                   + _reference_tokens(batch.completion_token_ids[refs[i]], tok.eos_token_id, max_ref_tokens) + tail
                   for i in rows]
        stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
        kls = conditioned_kl(policy.model, tok, prompts, teacher, [list(batch.completion_token_ids[i]) for i in rows],
                             kl_dir=kl_dir, top_k=top_k, batch_size=batch_size, kl_chunk=kl_chunk, stats=stats)
        weights[rows] = sc_grpo_weights(padded(kls, mask.shape[1]), mask[rows], w_min=w_min, w_max=w_max, gamma=gamma)
    return reweighted_credit(advantage, weights, batch)
