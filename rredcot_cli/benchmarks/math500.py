"""MATH-500: the 500-problem test subset of MATH (Hendrycks et al., 2021) chosen by Lightman et al. (2023).

Rows have ``problem``, ``solution``, ``answer`` (LaTeX), ``subject``, ``level`` and ``unique_id``.
The gold is ``answer``; completions are checked with math-verify
(``rredcot_cli.benchmarks.verify.math_equal``) on their boxed answer (the last ``\\boxed{}``, or
last run of boxes), else on the answer they state after "final answer is" / "the answer is"
(``BoxedMathBenchmark.extract_answer``; why, in ``verify``'s "Grading decisions").
"""

from __future__ import annotations

from itertools import islice

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.boxed import BoxedMathBenchmark
from rredcot_cli.data import read_split
from rredcot_cli.errors import RredcotError


class MATH500Benchmark(BoxedMathBenchmark):
    """The MATH-500 benchmark (split ``test`` is packaged)."""

    name = "math500"
    HUB_CONFIG = None

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
