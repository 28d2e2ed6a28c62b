"""The benchmark contract shared by the synthetic tasks and the real math benchmarks.

A benchmark turns a split into ``Problem`` rows, a problem into a prompt string, and a completion
into a reward. The training reward and the eval metric both call ``verify``.
"""

from __future__ import annotations

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
        """The final answer written in ``completion``, or None if there is none."""

    def verify(self, completion: str, problem: Problem) -> float | None:
        """1.0 correct, 0.0 wrong, None unscorable (e.g. the verifier timed out)."""


@runtime_checkable
class StepCheckedBenchmark(Benchmark, Protocol):
    """Synthetic benchmarks also know where a chain first goes wrong."""

    def first_wrong_step(self, completion: str, problem: Problem) -> int | None:
        """0-based index of the first wrong step line, or None if every step is right."""

    def step_char_spans(self, completion: str) -> list[tuple[int, int]]:
        """Character spans [start, end) of the step lines in ``completion``, in order."""
