"""Evaluation metrics: pure functions over per-sample rows (no torch, no I/O).

A row is a dict with at least ``prompt_id``, ``correct`` (True/False, or None when the verifier
could not score the sample), ``pred_answer`` (str or None), ``num_tokens`` and ``steps`` (chain
length of a synthetic problem, None for real benchmarks); ``sample_idx`` orders the samples of a
problem when present (file order otherwise), and ``scorable`` False also marks an unscorable
sample. Unscorable samples count as wrong in pass@k/maj@k
and are reported separately as ``unscorable_frac``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021).

    ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)`` so that large
    ``n`` does not overflow.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _vote_key(answer: str) -> str:
    """Answers are compared with all whitespace removed."""
    return "".join(answer.split())


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool | None], k: int) -> bool:
    """Whether the majority answer among the first ``k`` samples is correct.

    None answers do not vote; ties go to the answer that appeared first; answers are compared
    with whitespace removed. The majority answer counts as correct if any of the first ``k``
    samples giving it was verified correct (a verifier timeout on one copy does not flip it).
    False when none of the first ``k`` samples has an answer.
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} vs {len(correct)}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    votes: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for i, answer in enumerate(answers[:k]):
        if answer is None:
            continue
        key = _vote_key(answer)
        votes[key] += 1
        first_seen.setdefault(key, i)
    if not votes:
        return False
    winner = max(votes, key=lambda a: (votes[a], -first_seen[a]))
    return any(bool(ok) for a, ok in zip(answers[:k], correct[:k]) if a is not None and _vote_key(a) == winner)


def _unscorable(row: dict[str, Any]) -> bool:
    """A sample the verifier could not score: ``correct`` None, or ``scorable`` False when present."""
    return row["correct"] is None or row.get("scorable") is False


def _group_by_prompt(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows of each prompt, in first-appearance order of prompts, sorted by ``sample_idx`` if present."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["prompt_id"], []).append(row)
    for prompt_id, group in groups.items():
        if all(r.get("sample_idx") is not None for r in group):
            groups[prompt_id] = sorted(group, key=lambda r: r["sample_idx"])
    return groups


def summarize_eval(rows: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """Per-problem metrics averaged over problems.

    Returns ``num_problems``, ``num_samples``, ``n`` (the smallest number of samples of a
    problem), ``pass@1`` (mean over problems of the fraction of correct samples), ``pass@k`` and
    ``maj@k`` for every ``k`` in ``ks`` with ``k <= n`` (larger ``k`` are left out),
    ``unscorable_frac`` (samples with ``correct`` None or ``scorable`` False) and ``mean_tokens``
    (mean ``num_tokens``).
    """
    if not rows:
        raise ValueError("summarize_eval needs at least one row")
    groups = _group_by_prompt(rows)
    n_min = min(len(g) for g in groups.values())
    valid_ks = sorted({int(k) for k in ks if 1 <= int(k) <= n_min})
    summary: dict[str, Any] = {
        "num_problems": len(groups),
        "num_samples": len(rows),
        "n": n_min,
        "pass@1": float(np.mean([sum(bool(r["correct"]) for r in g) / len(g) for g in groups.values()])),
    }
    for k in valid_ks:
        summary[f"pass@{k}"] = float(
            np.mean([pass_at_k(len(g), sum(bool(r["correct"]) for r in g), k) for g in groups.values()])
        )
    for k in valid_ks:
        summary[f"maj@{k}"] = float(
            np.mean([maj_at_k([r["pred_answer"] for r in g], [r["correct"] for r in g], k) for g in groups.values()])
        )
    summary["unscorable_frac"] = sum(_unscorable(r) for r in rows) / len(rows)
    summary["mean_tokens"] = float(np.mean([r["num_tokens"] for r in rows]))
    return summary


def accuracy_by_bucket(rows: Sequence[dict[str, Any]], key: str = "steps") -> dict[Any, dict[str, float]]:
    """Accuracy of the samples grouped by ``row[key]`` (e.g. chain length), sorted by bucket.

    Each bucket maps to ``{"accuracy", "num_samples", "num_problems"}``; rows whose ``key`` is
    None are left out; unscorable samples count as wrong.
    """
    buckets: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get(key) is not None:
            buckets.setdefault(row[key], []).append(row)
    return {
        value: {
            "accuracy": sum(bool(r["correct"]) for r in group) / len(group),
            "num_samples": len(group),
            "num_problems": len({r["prompt_id"] for r in group}),
        }
        for value, group in sorted(buckets.items())
    }


def _t_two_sided_prob(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4, exact)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 1:
        total, term = 0.0, math.cos(theta)  # cos(theta) + 2/3 cos^3 + (2*4)/(3*5) cos^5 ...
        for j in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * j) / (2 * j + 1)
        return (2.0 / math.pi) * (theta + s * total) if df > 1 else 2.0 * theta / math.pi
    total, term = 0.0, 1.0  # 1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 ...
    for j in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * j - 1) / (2 * j)
    return s * total


def t_quantile(confidence: float, df: int) -> float:
    """The ``t`` with ``P(|T| <= t) = confidence`` for Student's t with ``df`` degrees of freedom."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    lo, hi = 0.0, 1.0
    while _t_two_sided_prob(hi, df) < confidence:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_two_sided_prob(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def t_upper_tail(t: float, df: int) -> float:
    """P(T >= t) for Student's t with ``df`` degrees of freedom (one-sided p-values, e.g. TOST)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    tail = 0.5 * (1.0 - _t_two_sided_prob(abs(t), df))
    return tail if t >= 0 else 1.0 - tail


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean and its Student-t confidence interval.

    With a single value the bounds are NaN; with no values a ValueError is raised.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, math.nan, math.nan
    half = t_quantile(confidence, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half
