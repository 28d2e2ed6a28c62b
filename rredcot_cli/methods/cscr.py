"""CSCR: Counterfactual Sensitivity Credit Reallocation (He, Wu, Wang, 2026, "Not All Tokens
Deserve Equal Credit: Counterfactual Sensitivity Credit Reallocation for Long-CoT Reasoning",
arXiv 2607.27888).

The abstract [ABS]: fix each sampled completion and re-score it under two opposing outcome
conditions, one asserting it is correct and one asserting it is incorrect; tokens whose
log-probability shifts a lot under *both* are substitutable surface form, not learning value, so
CSCR down-weights them and renormalises, keeping the credit budget and the advantage's sign.
The full text was not available: everything below the first step is INFERRED
(docs/design/peer-methods.md section 2), and every inferred choice is a knob.

    A_i            host advantage: GRPO (``scale_by_std``) or Dr. GRPO
    l_t(c)         log pi(y_t | c, y_<t), all contexts rescored with the same teacher-forced pass
    D+_t = l_t(c+) - l_t(x),   D-_t = l_t(c-) - l_t(x)
    s_t  = (|D+_t| + |D-_t|) / 2   (``sensitivity=mean``; ``max``: max(|D+_t|, |D-_t|))   INFERRED
    s^_t = s_t / (mean_t s_t + 1e-6)
    w~_t = 1 / (1 + alpha s^_t)    (``weight_direction=down``; ``up``: 1 + alpha s^_t, the
                                    RLSD/SC-GRPO direction, for ablation)               INFERRED
    w~_t = max(w~_t, w_min);  w = w~ T_i / sum w~;  w = clip(w, w_min, w_max);  w = w T_i / sum w
    A_{i,t} = A_i w_t

Contexts (``condition``), appended to the prompt tokens (after any chat template's generation
prompt, so the completion is scored as if it followed the note):
  assert       c+ = x + ``correct_note``, c- = x + ``incorrect_note``               INFERRED wording
  answer_hint  c+ = x + ``hint_template`` with the gold answer, c- = the same with a wrong answer
               that a failed completion of the group gave (CEPO/RLCSD-like variant, INFERRED); a
               completion whose group has no parseable wrong answer keeps w = 1.
Completions of groups with advantage 0 are not scored (w would not matter). Diagnostics go to
``batch.extras["value_stats"]``: forward tokens, and the fraction of tokens where D+ and D- have
the same sign (the paper's headline observation).

Cost: +3F per scored completion (base, c+ and c-; the paper's +2F reuses the old log-probs,
which here come from the sampler at the sampling temperature, see _rescore.py).
Shapes: delta_pos, delta_neg, mask (B, T) -> weights (B, T), mean 1 over each row's tokens,
0 on padding; Credit token advantages (B, T), segment credits = mean token advantage per segment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._rescore import encode, sampled_token_logprobs
from rredcot_cli.methods._token_weights import masked_mean, mean_one, padded, reweighted_credit
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.grpo import grpo_advantage

Sensitivity = Literal["mean", "max"]
WeightDirection = Literal["down", "up"]


@dataclass
class CSCRParams:
    condition: Literal["assert", "answer_hint"] = "assert"  # the two contexts (module docstring)
    correct_note: str = "\nNote: the solution below is verified to be CORRECT.\n"  # assert: c+ = x + this
    incorrect_note: str = "\nNote: the solution below is verified to be INCORRECT.\n"  # assert: c- = x + this
    hint_template: str = "\nNote: the final answer is {answer}.\n"  # answer_hint; {answer} is filled in
    alpha: float = 1.0  # strength of the reweighting: w~ = 1 / (1 + alpha s^)
    w_min: float = 0.1  # weights are clipped to [w_min, w_max]
    w_max: float = 3.0  # see w_min
    sensitivity: Sensitivity = "mean"  # mean or max of |D+|, |D-|
    weight_direction: WeightDirection = "down"  # down-weight sensitive tokens (CSCR) or up-weight them (ablation)
    scale_by_std: bool = True  # host advantage: GRPO (true) or Dr. GRPO (false)
    eps: float = 1e-6  # added to the group's reward std (host advantage)
    batch_size: int = 16  # completions per scoring forward


# Meaningful range of each numeric parameter (checked when the config is composed).
CSCR_RANGES = {
    "alpha": ">= 0",
    "w_min": "(0, 1]",
    "w_max": ">= 1",
    "eps": "> 0",
    "batch_size": ">= 1",
}


def cscr_weights(delta_pos: torch.Tensor, delta_neg: torch.Tensor, mask: torch.Tensor, *, alpha: float,
                 w_min: float, w_max: float, sensitivity: str = "mean", weight_direction: str = "down") -> torch.Tensor:
    """(B, T) log-prob shifts under the two conditions -> (B, T) weights, mean 1 per row, 0 on
    padding (steps 4-6 of the spec in the module docstring)."""
    if sensitivity not in get_args(Sensitivity):  # called directly, not only through a composed config
        raise ValueError(f"unknown sensitivity {sensitivity!r}; valid: {', '.join(get_args(Sensitivity))}")
    if weight_direction not in get_args(WeightDirection):
        raise ValueError(f"unknown weight_direction {weight_direction!r}; valid: {', '.join(get_args(WeightDirection))}")
    if not 0 < w_min <= 1 <= w_max:
        raise ValueError(f"cscr needs 0 < w_min <= 1 <= w_max, got {w_min} and {w_max}")
    a, b = delta_pos.abs(), delta_neg.abs()
    s = (a + b) / 2 if sensitivity == "mean" else torch.maximum(a, b)
    s = torch.where(mask, s, torch.zeros_like(s))
    s_hat = s / (masked_mean(s, mask) + 1e-6)
    w = 1 / (1 + alpha * s_hat) if weight_direction == "down" else 1 + alpha * s_hat
    w = mean_one(w.clamp(min=w_min), mask)
    return mean_one(w.clamp(w_min, w_max), mask)


def _wrong_answer(batch: CreditBatch, i: int) -> str | None:
    """An answer a failed completion of row i's group gave, different from the gold one."""
    gold = str(batch.extras["gold_answers"][i]).strip()
    for j in (batch.group_ids == batch.group_ids[i]).nonzero().flatten().tolist():
        pred = batch.extras["pred_answers"][j]
        if float(batch.rewards[j]) <= 0.5 and pred is not None and str(pred).strip() not in ("", gold):
            return str(pred).strip()
    return None


@register("cscr", params=CSCRParams, ranges=CSCR_RANGES, needs=("policy",))
def cscr(batch: CreditBatch, *, policy, condition: str, correct_note: str, incorrect_note: str, hint_template: str,
         alpha: float, w_min: float, w_max: float, sensitivity: str, weight_direction: str, scale_by_std: bool,
         eps: float, batch_size: int) -> Credit:
    """Host advantage reweighted by counterfactual sensitivity; ``policy`` (model, tokenizer)
    rescores the completions. Defaults of the keyword arguments live in ``CSCRParams``."""
    advantage = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std, eps)
    mask = batch.token_mask
    weights = mask.to(torch.float32)
    tok = policy.tokenizer
    rows, pos_ctx, neg_ctx = [], [], []
    for i in (advantage != 0).nonzero().flatten().tolist():
        prompt = list(batch.prompt_token_ids[i])
        if condition == "assert":
            pos, neg = correct_note, incorrect_note
        else:
            wrong = _wrong_answer(batch, i)
            if wrong is None:
                continue
            pos = hint_template.format(answer=str(batch.extras["gold_answers"][i]).strip())
            neg = hint_template.format(answer=wrong)
        rows.append(i)
        pos_ctx.append(prompt + encode(tok, pos))
        neg_ctx.append(prompt + encode(tok, neg))
    if rows:
        completions = [list(batch.completion_token_ids[i]) for i in rows]
        base = [list(batch.prompt_token_ids[i]) for i in rows]
        stats = batch.extras.setdefault("value_stats", {}) if batch.extras is not None else None
        # One scoring call over base, c+ and c- rows so they share forwards.
        scores = sampled_token_logprobs(policy.model, tok, base + pos_ctx + neg_ctx, completions * 3,
                                        batch_size=batch_size, stats=stats)
        T, R = mask.shape[1], len(rows)
        lp_base, lp_pos, lp_neg = (padded(scores[k * R : (k + 1) * R], T) for k in range(3))
        sub_mask = mask[rows]
        d_pos, d_neg = lp_pos - lp_base, lp_neg - lp_base
        weights[rows] = cscr_weights(d_pos, d_neg, sub_mask, alpha=alpha, w_min=w_min, w_max=w_max,
                                     sensitivity=sensitivity, weight_direction=weight_direction)
        if stats is not None:
            same = (torch.sign(d_pos) == torch.sign(d_neg)) & sub_mask
            stats["cscr_same_sign_fraction"] = float(same.sum() / sub_mask.sum().clamp(min=1))
    return reweighted_credit(advantage, weights, batch)
