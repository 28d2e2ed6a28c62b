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
              num_segments: torch.Tensor, rewards: torch.Tensor | None = None,
              segment_advantages: torch.Tensor | None = None) -> dict[str, float | None]:
    """Spearman and Pearson correlation with the MC reference, over every existing segment of
    every completion:

    - ``value_*``: the method's V(S_k) against the reference V(S_k), k = 1..K_i (None for a
      method without values, i.e. all NaN);
    - ``value_*_inner``: the same without the last segment, whose value is the observed reward
      for the reference and for every method that has values (agreement there is by definition);
    - ``value_mse_inner``: the mean squared difference from the reference on those inner
      boundaries. Unlike a rank correlation it scores calibration, and it compares fairly with
      the outcome control: the reference's Monte Carlo noise is independent of every estimator
      given the prefix (its continuations are fresh samples), so it adds the same constant to
      every row's MSE and a paired difference of two rows estimates their difference in MSE
      against the true value. The outcome control's MSE is then the outcome's own variance
      p(1 - p) at the prefix, which a value estimate exists to remove;
    - ``credit_*``: the method's segment credit against the reference credit V(S_k) - V(S_{k-1});
    - with ``rewards`` (B,): ``value_spearman_within`` (inner values) and ``credit_spearman_within``,
      the same inside groups of completions with the same reward (``spearman_within``), where a
      value that copies the outcome ranks nothing;
    - with ``segment_advantages`` (B, S), the mean token advantage of each segment (what the update
      pushes it by, after the method's advantage rule): ``advantage_spearman`` against the reference
      credit, and ``advantage_spearman_within`` inside one reward (with ``rewards``).
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
    v, r = finite_pairs(segment_values, ref_values, exists & not_last)
    out["value_mse_inner"] = float(((v - r) ** 2).mean()) if v.numel() else None
    c, r = finite_pairs(segment_credits, ref_credits, exists)
    out["credit_spearman"] = spearman(c, r)
    out["credit_pearson"] = pearson(c, r)
    if segment_advantages is not None:
        a, r = finite_pairs(segment_advantages, ref_credits, exists)
        out["advantage_spearman"] = spearman(a, r)
    if rewards is not None:
        same_reward = rewards[:, None].expand_as(exists)
        if segment_advantages is not None:
            out["advantage_spearman_within"] = spearman_within(segment_advantages, ref_credits, same_reward, exists)
        out["value_spearman_within"] = spearman_within(segment_values, ref_values, same_reward, exists & not_last)
        out["credit_spearman_within"] = spearman_within(segment_credits, ref_credits, same_reward, exists)
    return out


def spearman_within(x: torch.Tensor, y: torch.Tensor, strata: torch.Tensor, mask: torch.Tensor) -> float | None:
    """Spearman correlation of ``x`` with ``y`` inside each stratum (entries of ``strata`` with one
    value, e.g. completions of the same reward), averaged with weights = pairs per stratum; a
    stratum where either side is constant counts as 0 (it carries no ranking). None when no
    stratum has two finite pairs. This is where a value that copies the outcome earns nothing."""
    total = weight = 0.0
    for level in strata[mask].unique():
        a, b = finite_pairs(x, y, mask & (strata == level))
        if a.numel() < 2:
            continue
        rho = spearman(a, b)
        total += a.numel() * (rho if rho is not None else 0.0)
        weight += a.numel()
    return total / weight if weight else None


# --------------------------------------------------------------------------- controls

# Values that know nothing but what every method may see for free, judged beside the methods so
# that agreement with MC is read against them (issue 37): ``outcome`` copies the trace's own reward
# into every prefix value, ``baseline`` keeps the prompt's baseline (the group mean) until the
# reward. An estimator is worth its cost only where it beats both.
CONTROLS = ("outcome", "baseline")


def control_values(kind: str, rewards: torch.Tensor, group_ids: torch.Tensor, num_segments: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(segment_values, segment_credits), (B, S) each with NaN past K_i, of a control: V(S_0) = the
    group's mean reward, V(S_K) = R_i, and in between R_i (``outcome``) or the group mean
    (``baseline``)."""
    if kind not in CONTROLS:
        raise ValueError(f"unknown control {kind!r}; valid: {', '.join(CONTROLS)}")
    B, S = rewards.shape[0], int(num_segments.max()) if num_segments.numel() else 0
    group_mean = torch.zeros(B, dtype=torch.float64)
    for g in group_ids.unique():
        rows = group_ids == g
        group_mean[rows] = rewards[rows].double().mean()
    inner = rewards.double() if kind == "outcome" else group_mean
    values = torch.full((B, S + 1), float("nan"), dtype=torch.float64)
    for i in range(B):
        K = int(num_segments[i])
        values[i, 0] = group_mean[i]
        values[i, 1:K] = inner[i]
        values[i, K] = float(rewards[i])
    credits = reference_credits(values, num_segments)
    exists = segment_exists(num_segments, S)
    return torch.where(exists, values[:, 1:], torch.full_like(credits, float("nan"))), credits


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


def token_char_ends(tokenizer: Any, token_ids: Sequence[int]) -> list[int]:
    """Per token, the number of characters of the completion's text decoded through it.

    Decoded cumulatively, not token by token: in byte-level BPE one character (÷, ×, a LaTeX
    symbol, any non-ASCII letter) can be split over two or three tokens, each of which decodes on
    its own to a replacement character, so adding up per-token lengths counts it two or three times
    and shifts every later offset. A prefix that ends inside such a character decodes with a
    trailing U+FFFD, which is not counted (the character belongs to the token that completes it)."""
    ends = []
    for t in range(len(token_ids)):
        text = tokenizer.decode(list(token_ids[: t + 1]), skip_special_tokens=False)
        ends.append(len(text.rstrip("\ufffd")))
    return ends


def token_at_completion_char(tokenizer: Any, token_ids: Sequence[int], char: int) -> int:
    """Index of the token that completes character ``char`` of the decoded completion (the last token
    when ``char`` is past the end), exact on byte-level BPE (``token_char_ends``)."""
    for t, end in enumerate(token_char_ends(tokenizer, token_ids)):
        if end > char:
            return t
    return len(token_ids) - 1


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
        token = token_at_completion_char(tokenizer, sample["completion_token_ids"], spans[wrong][0])
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
