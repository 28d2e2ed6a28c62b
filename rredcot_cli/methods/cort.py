"""CoRT-analog: Counterfactual Replay for Token-level rubric-guided policy optimisation
(arXiv 2607.25659, "CoRT: Counterfactual Replay for Token-Level Rubric-Guided Policy
Optimization").

The abstract [ABS]: in rubric-conditioned GRPO, re-score each sampled response under the
rubric-conditioned prompt it was sampled with and under a matched criteria-free prompt; the
tokenwise log-likelihood contrasts proxy how much a token depends on the rubric and become
bounded, response-normalised weights that redistribute the signed GRPO advantage. The full text
was not available: the forms below are INFERRED (docs/design/peer-methods.md section 4), and
every inferred choice is a knob.

The benchmarks here have no rubric, so this is the **CoRT-analog** the spec prescribes for math:
the conditioning block is an instruction present in the prompt at sampling and removed at replay.
``blocks`` lists candidate instruction texts; the first one found in a decoded prompt is removed
(once) and the rest re-encoded. The defaults are the instructions of the shipped benchmarks:
``Compute mod 10:`` (chain, chain_long), ``Find the first x in`` (search) and the boxed-answer
sentence (gsm8k, math500). A prompt containing none of them fails (``missing_block=error``) or
keeps w = 1 (``skip``), since without a removed block CoRT is plain GRPO.

    A_i          host advantage: GRPO (``scale_by_std``) or Dr. GRPO
    c_t = l_t(x_R) - l_t(x_0)   log pi(y_t | ., y_<t) with (x_R) and without (x_0) the block
    z_t = (c_t - mean_t c) / (std_t c + 1e-6)   (population std over the completion)      INFERRED
          ``contrast=abs``: |z_t| (ablation); ``flip_negative``: -z_t where A_i < 0     INFERRED
    w~_t = 1 + lam tanh(z_t) in [1 - lam, 1 + lam];  w_t = w~_t T_i / sum_t w~_t          INFERRED
    A_{i,t} = A_i w_t

Completions of groups with advantage 0 are not scored. Cost: +2F per scored completion (both
prompts rescored with the same pass; the paper's +1F reuses the old log-probs, which here come
from the sampler at the sampling temperature, see _rescore.py).
Shapes: contrast, mask (B, T), advantage (B,) -> weights (B, T), mean 1 over each row's tokens,
0 on padding; Credit segment credits = mean token advantage per segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._rescore import encode, sampled_token_logprobs
from rredcot_cli.methods._token_weights import masked_mean, masked_std, mean_one, padded, reweighted_credit
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.grpo import grpo_advantage

Contrast = Literal["signed", "abs"]
DEFAULT_BLOCKS = [
    "Compute mod 10:",
    "Find the first x in",
    "\nLet's think step by step and output the final answer within \\boxed{}.",
]


@dataclass
class CoRTParams:
    blocks: List[str] = field(default_factory=lambda: list(DEFAULT_BLOCKS))  # instruction texts removed at replay
    missing_block: Literal["error", "skip"] = "error"  # when a prompt holds none of the blocks: fail, or w = 1
    lam: float = 0.5  # weights lie in [1 - lam, 1 + lam] before renormalising; 0 <= lam < 1
    contrast: Contrast = "signed"  # z as is, or |z| (ablation)
    flip_negative: bool = False  # use -z on completions with a negative advantage
    scale_by_std: bool = True  # host advantage: GRPO (true) or Dr. GRPO (false)
    eps: float = 1e-6  # added to the group's reward std (host advantage)
    batch_size: int = 16  # completions per scoring forward


# Meaningful range of each numeric parameter (checked when the config is composed).
CORT_RANGES = {
    "lam": "[0, 1); weights 1 + lam*tanh(z) must stay positive",
    "eps": "> 0",
    "batch_size": ">= 1",
}


def cort_weights(contrast: torch.Tensor, mask: torch.Tensor, advantage: torch.Tensor, *, lam: float,
                 mode: str = "signed", flip_negative: bool = False) -> torch.Tensor:
    """(B, T) log-likelihood contrasts, (B,) advantages -> (B, T) weights, mean 1 per row, 0 on
    padding."""
    if mode not in get_args(Contrast):  # called directly, not only through a composed config
        raise ValueError(f"unknown contrast {mode!r}; valid: {', '.join(get_args(Contrast))}")
    if not 0 <= lam < 1:
        raise ValueError(f"cort needs 0 <= lam < 1 so weights stay positive (keep the sign of A), got {lam}")
    z = (contrast - masked_mean(contrast, mask)) / (masked_std(contrast, mask) + 1e-6)
    if mode == "abs":
        z = z.abs()
    if flip_negative:
        z = torch.where(advantage[:, None] < 0, -z, z)
    return mean_one(1 + lam * torch.tanh(z), mask)


def remove_block(text: str, blocks: list[str]) -> str | None:
    """``text`` without the first occurrence of the first block it contains; None if none."""
    for block in blocks:
        if block and block in text:
            return text.replace(block, "", 1)
    return None


@register("cort", params=CoRTParams, ranges=CORT_RANGES, needs=("policy",))
def cort(batch: CreditBatch, *, policy, blocks: list[str], missing_block: str, lam: float, contrast: str,
         flip_negative: bool, scale_by_std: bool, eps: float, batch_size: int) -> Credit:
    """Host advantage reweighted by the contrast between prompts with and without the
    instruction block; ``policy`` (model, tokenizer) rescores. Defaults of the keyword arguments
    live in ``CoRTParams``."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    mask = batch.token_mask
    weights = mask.to(torch.float32)
    tok = policy.tokenizer
    rows, free_prompts = [], []
    for i in (advantage != 0).nonzero().flatten().tolist():
        text = tok.decode(batch.prompt_token_ids[i], skip_special_tokens=False)
        free = remove_block(text, list(blocks))
        if free is None:
            if missing_block == "error":
                raise ValueError(f"cort: prompt {text[:60]!r}... holds none of method.blocks={list(blocks)}; "
                                 "set method.blocks to the instruction present at sampling "
                                 "(or method.missing_block=skip)")
            continue
        free_ids = encode(tok, free)
        if not free_ids:
            raise ValueError(f"cort: removing the block leaves an empty prompt: {text!r}")
        rows.append(i)
        free_prompts.append(free_ids)
    if rows:
        completions = [list(batch.completion_token_ids[i]) for i in rows]
        conditioned = [list(batch.prompt_token_ids[i]) for i in rows]
        stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
        scores = sampled_token_logprobs(policy.model, tok, conditioned + free_prompts, completions * 2,
                                        batch_size=batch_size, stats=stats)
        T, R = mask.shape[1], len(rows)
        c = padded(scores[:R], T) - padded(scores[R:], T)
        weights[rows] = cort_weights(c, mask[rows], advantage[rows], lam=lam, mode=contrast,
                                     flip_negative=flip_negative)
    return reweighted_credit(advantage, weights, batch)
