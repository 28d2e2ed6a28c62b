"""Judging credit: how well a method's segment credit matches Monte Carlo values, whether it
points at the first wrong step, how much it moves between reruns. Pure functions over tensors and
sample rows; ``rredcot judge`` (rredcot_cli/stages/judge.py) runs the methods and writes the table.

Shapes: B completions, S = max segments, T tokens. A method's ``segment_values`` and
``segment_credits`` are (B, S) with NaN past K_i; MC reference values are (B, S+1) holding
V(S_0..S_K) (rredcot_cli/methods/mc.py ``mc_reference_values``); the reference credit of segment
k is V(S_k) - V(S_{k-1}).

Correlations are computed in float64 over the (value, reference) pairs where both are finite;
Spearman is Pearson on average ranks (tied values share the mean of the ranks they span). A
correlation is None when fewer than two pairs remain or either side is constant (undefined).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import torch

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.pipeline import token_texts


# --------------------------------------------------------------------------- correlation


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of the values of ``x`` (flattened), ties averaged: [10, 20, 20, 5] -> [2, 3.5, 3.5, 1]."""
    x = x.reshape(-1).to(torch.float64)
    order = torch.argsort(x, stable=True)
    _, counts = torch.unique_consecutive(x[order], return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)  # 1-based rank of the last member of each run of ties
    starts = ends - counts + 1
    ranks = torch.empty_like(x)
    ranks[order] = ((starts + ends) / 2).repeat_interleave(counts)
    return ranks


def pearson(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Pearson correlation of two equally long 1-D tensors; None if n < 2 or either is constant."""
    x, y = x.reshape(-1).to(torch.float64), y.reshape(-1).to(torch.float64)
    if x.numel() != y.numel():
        raise ValueError(f"pearson: {x.numel()} vs {y.numel()} values")
    if x.numel() < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy = float((dx * dx).sum()), float((dy * dy).sum())
    if sxx == 0.0 or syy == 0.0:
        return None
    return max(-1.0, min(1.0, float((dx * dy).sum()) / (sxx * syy) ** 0.5))


def spearman(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """Spearman rank correlation (Pearson on average ranks); None where Pearson is undefined."""
    if x.numel() != y.numel():
        raise ValueError(f"spearman: {x.numel()} vs {y.numel()} values")
    return pearson(average_ranks(x), average_ranks(y))


def finite_pairs(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of ``a`` and ``b`` (same shape) where both are finite (and ``mask`` is True)."""
    keep = torch.isfinite(a) & torch.isfinite(b)
    if mask is not None:
        keep &= mask
    return a[keep], b[keep]


def segment_exists(num_segments: torch.Tensor, S: int) -> torch.Tensor:
    """(B, S) bool: segment k of completion i exists (k < K_i)."""
    return torch.arange(S)[None, :] < num_segments[:, None]


def reference_credits(reference: torch.Tensor, num_segments: torch.Tensor) -> torch.Tensor:
    """(B, S+1) values V(S_0..S_K) -> (B, S) credits V(S_k) - V(S_{k-1}), NaN past K_i."""
    credits = reference[:, 1:] - reference[:, :-1]
    return torch.where(segment_exists(num_segments, credits.shape[1]), credits, torch.full_like(credits, float("nan")))


def agreement(segment_values: torch.Tensor, segment_credits: torch.Tensor, reference: torch.Tensor,
              num_segments: torch.Tensor) -> dict[str, float | None]:
    """Spearman and Pearson correlation with the MC reference, over every existing segment of
    every completion:

    - ``value_*``: the method's V(S_k) against the reference V(S_k), k = 1..K_i (None for a
      method without values, i.e. all NaN);
    - ``value_*_inner``: the same without the last segment, whose value is the observed reward
      for the reference and for every method that has values (agreement there is by definition);
    - ``credit_*``: the method's segment credit against the reference credit V(S_k) - V(S_{k-1}).
    """
    S = segment_credits.shape[1]
    if reference.shape[1] != S + 1:
        raise ValueError(f"reference has {reference.shape[1]} value columns for {S} segments (expected {S + 1})")
    exists = segment_exists(num_segments, S)
    not_last = torch.arange(S)[None, :] < (num_segments[:, None] - 1)
    ref_values, ref_credits = reference[:, 1:], reference_credits(reference, num_segments)
    out: dict[str, float | None] = {}
    for suffix, mask in (("", exists), ("_inner", exists & not_last)):
        v, r = finite_pairs(segment_values, ref_values, mask)
        out[f"value_spearman{suffix}"] = spearman(v, r)
        out[f"value_pearson{suffix}"] = pearson(v, r)
    c, r = finite_pairs(segment_credits, ref_credits, exists)
    out["credit_spearman"] = spearman(c, r)
    out["credit_pearson"] = pearson(c, r)
    return out


def constant_within_completions(segment_credits: torch.Tensor, num_segments: torch.Tensor) -> bool:
    """True when every completion gives all of its segments the same credit (GRPO-like methods)."""
    for i in range(segment_credits.shape[0]):
        row = segment_credits[i, : int(num_segments[i])]
        if row.numel() and not bool((row == row[0]).all()):
            return False
    return True


def advantage_spread(token_advantages: Sequence[torch.Tensor], token_mask: torch.Tensor) -> float | None:
    """Mean over completion tokens of the standard deviation (Bessel-corrected) of the token
    advantage across reruns; None with fewer than two reruns."""
    if len(token_advantages) < 2:
        return None
    std = torch.stack([a.to(torch.float64) for a in token_advantages]).std(dim=0)
    return float(std[token_mask].mean()) if bool(token_mask.any()) else 0.0


# --------------------------------------------------------------------------- first-error localisation


def problem_of(sample: dict[str, Any]) -> Problem:
    """The problem of a samples-artifact row (synthetic benchmarks keep everything needed to
    rebuild the gold chain in ``meta``)."""
    return Problem(prompt_id=sample["prompt_id"], question="", gold_answer=sample["gold_answer"],
                   meta=json.loads(sample["meta"]) if sample.get("meta") else {})


def checks_steps(benchmark: Any) -> bool:
    """Whether the benchmark knows where a chain first goes wrong (the synthetic ones do)."""
    return hasattr(benchmark, "first_wrong_step") and hasattr(benchmark, "step_char_spans")


def token_at_char(token_texts: Sequence[str], char: int) -> int:
    """Index of the token whose text covers character ``char`` of their concatenation (the last
    token when ``char`` is past the end)."""
    offset = 0
    for t, text in enumerate(token_texts):
        if offset + len(text) > char:
            return t
        offset += len(text)
    return len(token_texts) - 1


def first_error_segments(samples: Sequence[dict[str, Any]], segment_ids: torch.Tensor, benchmark: Any,
                         problems: Sequence[Problem], tokenizer: Any) -> list[int | None]:
    """Per completion, the segment holding its first wrong step, or None: for correct completions
    (reward > 0.5), and for incorrect ones whose first wrong step is not a written step line (all
    written steps right and the chain stops early, or no step written).

    samples[i]: a samples-artifact row (``completion``, ``completion_token_ids``, ``reward``);
    segment_ids: (B, T) of the credit batch; problems[i]: sample i's problem."""
    targets: list[int | None] = []
    for i, sample in enumerate(samples):
        if sample["reward"] > 0.5:
            targets.append(None)
            continue
        wrong = benchmark.first_wrong_step(sample["completion"], problems[i])
        spans = benchmark.step_char_spans(sample["completion"])
        if wrong is None or wrong >= len(spans):
            targets.append(None)
            continue
        token = token_at_char(token_texts(tokenizer, sample["completion_token_ids"]), spans[wrong][0])
        targets.append(int(segment_ids[i, token]))
    return targets


def localisation(segment_credits: torch.Tensor, num_segments: torch.Tensor,
                 targets: Sequence[int | None]) -> tuple[int, int, float]:
    """(hits, completions with a target, summed chance level).

    A hit: the completion's lowest segment credit is strictly negative, unique, and at the target
    segment. Chance for a completion is 1 / K_i (a segment picked uniformly). All-equal credits
    (GRPO-like methods, or a group with no correct completion) never hit when K_i >= 2: a tie is
    not a localisation.
    """
    hits = total = 0
    chance = 0.0
    for i, target in enumerate(targets):
        if target is None:
            continue
        K = int(num_segments[i])
        credits = segment_credits[i, :K]
        total += 1
        chance += 1.0 / K
        lowest = credits.min()
        unique = int((credits == lowest).sum()) == 1
        hits += int(bool(lowest < 0) and unique and int(torch.argmin(credits)) == target)
    return hits, total, chance


def first_error_hits(samples: Sequence[dict[str, Any]], segment_credits: torch.Tensor, batch: Any, benchmark: Any,
                     problems: Sequence[Problem], tokenizer: Any) -> tuple[int, int, float]:
    """:func:`localisation` of ``segment_credits`` at the first wrong steps of ``samples``
    (rows of ``batch``, in order); problems[i] is sample i's problem."""
    targets = first_error_segments(samples, batch.segment_ids, benchmark, problems, tokenizer)
    return localisation(segment_credits, batch.num_segments, targets)
