"""The benchmark contract shared by the synthetic tasks and the real math benchmarks.

A benchmark turns a split into ``Problem`` rows, a problem into a prompt string, and a completion
into a reward. The training reward and the eval metric both call ``grade_completion``, which
calls the benchmark's ``verify`` (or, for the built-in real benchmarks, ``extract_answer`` then
``verify_answer``).

One extraction: the answer that is graded is the answer that is recorded (``pred_answer``) and
voted on (maj@k). A benchmark with ``verify_answer(answer, problem)`` grades exactly what its
``extract_answer`` returned; ``grade_completion`` returns both from one call, and it tells the
extractor whether the completion was cut off at the token budget (``finish_reason ==
"length"``): the real benchmarks then take the answer only from an explicit final-answer marker
(``\\boxed{}``, ``####``, ``The final answer is``), never from a last-number fallback.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    prompt_id: str  # stable across runs: "<benchmark>/<split>/<index or unique id>"
    question: str  # the problem text without any template
    gold_answer: str
    meta: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable extras (steps, level, ...)


@runtime_checkable
class Benchmark(Protocol):
    name: str

    def load(self, split: str, limit: int | None = None) -> list[Problem]:
        """Problems of ``split`` in a fixed order; the first ``limit`` if given."""

    def prompt(self, problem: Problem) -> str:
        """The text the model continues."""

    def extract_answer(self, completion: str) -> str | None:
        """The final answer written in ``completion``, or None if there is none (optionally with a
        keyword ``truncated``: the completion hit the token budget, see ``grade_completion``)."""

    def verify(self, completion: str, problem: Problem) -> float | None:
        """1.0 correct, 0.0 wrong, None unscorable (e.g. the verifier timed out); it must grade the
        answer ``extract_answer`` finds. Optionally a benchmark also has
        ``verify_answer(answer, problem)``, grading an extracted answer (None: no answer), which
        ``grade_completion`` then uses instead."""


@runtime_checkable
class StepCheckedBenchmark(Benchmark, Protocol):
    """Synthetic benchmarks also know where a chain first goes wrong."""

    def first_wrong_step(self, completion: str, problem: Problem) -> int | None:
        """0-based index of the first wrong step line, or None if every step is right."""

    def step_char_spans(self, completion: str) -> list[tuple[int, int]]:
        """Character spans [start, end) of the step lines in ``completion``, in order."""


def decided_outcome(benchmark: Any, prefix: str, gold_answer: str) -> float | None:
    """The reward every completion that starts with ``prefix`` will get, where the benchmark's
    grading already fixes it; None where later text could still change it, and for every
    benchmark that does not declare ``decided_outcome(prefix, gold_answer)``.

    Only a benchmark whose grading is final once an answer is written may declare it (the
    synthetic ones and jsonl's ``answer_line`` extractor grade the first ``Answer:`` line);
    last-number or last-answer grading (GSM8K, ``\\boxed{}``) may not, since a later answer replaces the earlier one. RREDCoT uses it as the
    value of a decided prefix (``methods/rredcot.py``); it grades the prefix text against the gold
    answer, never reads a completion's own reward."""
    decide = getattr(benchmark, "decided_outcome", None)
    return None if decide is None else decide(prefix, gold_answer)


def _takes_truncated(fn: Any) -> bool:
    """Whether ``fn`` accepts a ``truncated`` keyword (benchmarks written before it do not)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "truncated" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def grade_completion(benchmark: Any, completion: str, problem: Problem,
                     finish_reason: str = "stop") -> tuple[str | None, float | None]:
    """``(pred_answer, reward)`` of one completion: the one call that the training reward, the
    sample rows and the eval rows use.

    ``finish_reason`` is the backend's (``"stop"``: the model ended it; ``"length"``: cut off at
    ``max_new_tokens``); a truncated completion is passed to ``extract_answer`` as
    ``truncated=True`` where the benchmark takes that keyword. A benchmark with
    ``verify_answer(answer, problem)`` (the built-in real ones) has the extracted answer graded,
    so the recorded answer is the graded one by construction; any other benchmark gets
    ``extract_answer(completion)`` and ``verify(completion, problem)`` (keeping them consistent is
    its contract, as for the synthetic ones: both read the ``Answer:`` line).
    """
    truncated = finish_reason == "length"
    extract = benchmark.extract_answer
    answer = extract(completion, truncated=truncated) if _takes_truncated(extract) else extract(completion)
    verify_answer = getattr(benchmark, "verify_answer", None)
    if verify_answer is not None:
        return answer, verify_answer(answer, problem)
    verify = benchmark.verify
    return answer, verify(completion, problem, truncated=truncated) if _takes_truncated(verify) else verify(completion, problem)
