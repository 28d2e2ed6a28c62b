"""GRPO-VPS: GRPO refined by verifiable process supervision, the policy's own probability of the
gold answer at each segment boundary as a progress signal (Wang, Zhu, Weng, et al., 2026,
"GRPO-VPS: Enhancing Group Relative Policy Optimization with Verifiable Process Supervision for
Effective Reasoning", arXiv 2604.20659, ICLR 2026).

INFERRED: only the abstract could be read here (no method section, no released code found with
the search tools). What the abstract fixes: the generation is cut into segments; after each
segment boundary the conditional probability of the correct answer appended there is read from
the model itself (no rollouts, no auxiliary model); the segment-wise change of that probability
is a progress measurement that *refines* GRPO's trajectory-level advantage. Everything else below
is this implementation's reading, chosen so that it differs from RREDCoT's use of the same probe
(which replaces the outcome advantage by value differences) and keeps GRPO's signal:

    p_{i,k}   = pi(y* | x, S_{i,k}, probe)      k = 0..K_i-1 (S_0 = the prompt alone), y* the gold
                                                 answer, the benchmark's forced-answer probe:
                                                 RREDCoT's answer_probe read by delta_belief's
                                                 ``log_beliefs`` (targets=gold, summed log-probs)
    d_{i,k}   = p_{i,k} - p_{i,k-1}              k = 1..K_i-1; d_{i,K_i} = 0 (the final segment
                                                 writes the answer; a probe after it measures the
                                                 template, as delta_belief's default)
    A_i       = GRPO's group-normalised outcome advantage
    refine="reweight" (default): A_{i,t} = A_i w_{i,k(t)}, the mean-one segment weights of the
        attribution methods (``_attribution.attribution_advantages``, beta, w_min, w_max) with
        attributions d: a correct trace moves its credit to the segments that raised p, a wrong
        one its blame to those that lowered it; sign and total advantage per completion are GRPO's.
    refine="add": A_{i,t} = A_i + lam z_{i,k(t)}, z = d standardised over the group's segments
        (``_attribution._group_standardise``; all-equal pools exactly 0).

Groups whose rewards are all equal get A = 0 under "reweight" (as GRPO) and only the progress
term under "add".

Shapes: probe probabilities (B, S+1) (column k = p_k, NaN where not probed) -> progress (B, S)
(NaN past K_i) -> token advantages (B, T), exactly 0 on padding. Credit: segment_values = p_k for
k = 1..K_i (the last one is R_i), segment_credits = d_{i,k}. Cost: K_i short probes per
completion (packed after the trace), no generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

import torch

from rredcot_cli.methods import register
from rredcot_cli.methods._attribution import _group_standardise, attribution_advantages
from rredcot_cli.methods.base import Credit, CreditBatch
from rredcot_cli.methods.delta_belief import ProbeScoring, log_beliefs
from rredcot_cli.methods.grpo import grpo_advantage

Refinement = Literal["reweight", "add"]


@dataclass
class GRPOVPSParams:
    refine: Refinement = "reweight"  # reweight (A_i x mean-one weights) or add (A_i + lam z)
    beta: float = 1.0  # reweight: w~ = clip(1 + beta z, w_min, w_max)
    w_min: float = 0.1  # reweight: lower clip of the weights
    w_max: float = 3.0  # reweight: upper clip of the weights
    lam: float = 1.0  # add: weight of the standardised progress
    eps: float = 1e-6  # added to the group's std (progress and outcome)
    # Forced-answer template with {answer} (and {eos}); null = the benchmark's ANSWER_PROBE.
    probe_template: Optional[str] = None
    probe_scoring: ProbeScoring = "packed"  # how probes reuse their prefix (values/packing.py)


GRPO_VPS_RANGES = {
    "beta": ">= 0",
    "w_min": ">= 0",
    "w_max": ">= 1",
    "lam": ">= 0",
    "eps": "> 0",
}


def segment_progress(probs: torch.Tensor, num_segments: torch.Tensor) -> torch.Tensor:
    """(B, S+1) probe probabilities p_0..p_{K-1} (columns past K_i - 1 ignored) -> (B, S) progress
    d_k = p_k - p_{k-1} for k < K_i, 0 for the final segment, NaN past K_i."""
    probs = probs.to(torch.float32)
    d = probs[:, 1:] - probs[:, :-1]
    k = torch.arange(d.shape[1])[None, :]
    d = torch.where(k == num_segments[:, None] - 1, torch.zeros_like(d), d)
    return torch.where(k < num_segments[:, None], d, torch.full_like(d, float("nan")))


def vps_credit(probs: torch.Tensor, batch: CreditBatch, *, refine: str, beta: float, w_min: float, w_max: float,
               lam: float, eps: float) -> Credit:
    """Credit from the probe probabilities (B, S+1) (the module docstring's formulas)."""
    if refine not in get_args(Refinement):  # called directly, not only through a composed config
        raise ValueError(f"unknown refine {refine!r}; valid: {', '.join(get_args(Refinement))}")
    S = batch.max_segments
    probs = probs[:, : S + 1]
    progress = segment_progress(probs, batch.num_segments)
    if refine == "reweight":
        credit = attribution_advantages(progress, batch, beta=beta, w_min=w_min, w_max=w_max, eps=eps)
    else:
        outcome = grpo_advantage(batch.rewards, batch.group_ids, scale_by_std=True, eps=eps)
        z = torch.nan_to_num(_group_standardise(progress, batch.group_ids, eps), nan=0.0)
        seg_adv = outcome[:, None] + lam * z
        mask = batch.token_mask
        tokens = torch.gather(seg_adv, 1, batch.segment_ids.clamp(min=0)) * mask if S else torch.zeros(mask.shape)
        credit = Credit(token_advantages=tokens.to(torch.float32).contiguous(), segment_values=progress.clone(),
                        segment_credits=progress)
    exists = torch.arange(S)[None, :] < batch.num_segments[:, None]
    last = torch.arange(S)[None, :] == batch.num_segments[:, None] - 1
    values = torch.where(last, batch.rewards.to(torch.float32)[:, None].expand(-1, S), probs[:, 1:].to(torch.float32))
    credit.segment_values = torch.where(exists, values, torch.full_like(values, float("nan")))
    credit.segment_credits = progress
    return credit


@register("grpo_vps", params=GRPOVPSParams, ranges=GRPO_VPS_RANGES, needs=("policy",),
          forced_answer=lambda params: True)
def grpo_vps(batch: CreditBatch, *, policy, refine: str, beta: float, w_min: float, w_max: float, lam: float,
             eps: float, probe_template: Optional[str], probe_scoring: str) -> Credit:
    """Probe the gold answer after the prompt and every segment but the last, then refine GRPO's
    advantage with the progress. ``policy`` (model, tokenizer, device) is probed; ``batch.extras``
    must hold ``gold_answers`` and, without ``probe_template``, ``answer_probe``."""
    template = probe_template or (batch.extras or {}).get("answer_probe")
    if not template:
        raise ValueError("grpo_vps probes the gold answer: set method.probe_template (the benchmark has none)")
    logs = log_beliefs(batch, policy, template=template, agg="sum", targets="gold", final_segment="outcome",
                       probe_scoring=probe_scoring)
    return vps_credit(logs.exp(), batch, refine=refine, beta=beta, w_min=w_min, w_max=w_max, lam=lam, eps=eps)
