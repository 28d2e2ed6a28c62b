"""MATH-500: the 500-problem test subset of MATH (Hendrycks et al., 2021) chosen by Lightman et al. (2023).

Rows have ``problem``, ``solution``, ``answer`` (LaTeX), ``subject``, ``level`` and ``unique_id``.
The gold is ``answer``; completions are checked with math-verify
(``rredcot_cli.verify.math_equal``) on their last ``\\boxed{}``.
"""

from __future__ import annotations

from itertools import islice

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.data import read_split
from rredcot_cli.errors import RredcotError
from rredcot_cli.verify import extract_boxed, math_equal


class MATH500Benchmark:
    """The MATH-500 benchmark (split ``test`` is packaged)."""

    name = "math500"
    # verl-style math prompt; ``{question}`` is the problem text.
    PROMPT_TEMPLATE = "{question}\nLet's think step by step and output the final answer within \\boxed{{}}."
    # Forced-answer probe for value estimation (RREDCoT answer_probe): the part from {answer} on
    # is scored after a prefix of the chain of thought.
    ANSWER_PROBE = "\nThe final answer is $\\boxed{{answer}}$"
    HUB_CONFIG = None

    def __init__(self, path: str | None = None, verify_timeout_s: float = 5.0) -> None:
        self.path = path
        self.verify_timeout_s = verify_timeout_s

    def load(self, split: str, limit: int | None = None) -> list[Problem]:
        """Problems of ``split`` in file order; the first ``limit`` if given.

        ``prompt_id`` is ``math500/<split>/<unique_id>`` (the row index when a row has no
        ``unique_id``); ``meta`` holds ``subject``, ``level`` and ``unique_id``.
        """
        problems = []
        seen: set[str] = set()
        records = read_split(self.name, split, self.path, hub_config=self.HUB_CONFIG)
        for index, (location, row) in enumerate(islice(records, limit)):
            question, answer = row.get("problem"), row.get("answer")
            if not isinstance(question, str) or not isinstance(answer, str) or not answer.strip():
                raise RredcotError(f"{location}: a MATH-500 row needs string fields 'problem' and 'answer' (non-empty)")
            unique_id = row.get("unique_id")
            key = str(unique_id) if unique_id not in (None, "") else str(index)
            if key in seen:
                raise RredcotError(f"{location}: duplicate unique_id {key!r}")
            seen.add(key)
            meta = {
                "subject": row.get("subject"),
                "level": row.get("level"),
                "unique_id": unique_id,
            }
            problems.append(Problem(prompt_id=f"{self.name}/{split}/{key}", question=question, gold_answer=answer.strip(), meta=meta))
        if not problems and limit != 0:
            raise RredcotError(f"benchmark {self.name}: split {split!r} ({self.path or 'packaged copy'}) has no rows")
        return problems

    def prompt(self, problem: Problem) -> str:
        """The problem followed by the step-by-step / ``\\boxed{}`` instruction."""
        return self.PROMPT_TEMPLATE.format(question=problem.question)

    def extract_answer(self, completion: str) -> str | None:
        """The content of the last ``\\boxed{}``, or None."""
        return extract_boxed(completion)

    def verify(self, completion: str, problem: Problem) -> float | None:
        """1.0 / 0.0 from math-verify against ``answer``; None if the check timed out or failed."""
        result = math_equal(problem.gold_answer, completion, timeout_s=self.verify_timeout_s)
        if result is None:
            return None
        return 1.0 if result else 0.0
