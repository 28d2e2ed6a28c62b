"""The verifier against the reference solutions of all 500 MATH-500 problems.

Every gold ``solution`` (a worked solution ending in ``\\boxed{answer}``) must be accepted against
its ``answer``, and a wrong answer for every problem must be rejected. About 10 s on 2 cores.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rredcot_cli.benchmarks.verify import _boxed_span, math_equal

DATA = Path(__file__).resolve().parents[2] / "rredcot_cli" / "data" / "math500" / "test.jsonl"
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 500
    return rows


def _norm(answer: str) -> str:
    """Whitespace-free answer without a leading ``x=``-style assignment (``x=5`` means ``5``)."""
    return re.sub(r"^[a-zA-Z]=", "", "".join(answer.split()))


def _replace_last_boxed(solution: str, new_content: str) -> str:
    span = _boxed_span(solution)
    assert span is not None
    _, start, end = span
    return solution[:start] + new_content + solution[end:]


def test_every_gold_solution_is_accepted(rows):
    failures = [
        (row["unique_id"], row["answer"], math_equal(row["answer"], row["solution"], timeout_s=TIMEOUT_S))
        for row in rows
    ]
    failures = [f for f in failures if f[2] is not True]
    assert not failures, f"{len(failures)} gold solutions not accepted: {failures[:10]}"


def test_another_problems_answer_is_rejected(rows):
    """Each solution with its boxed answer replaced by the next problem's (different) answer."""
    failures = []
    for i, row in enumerate(rows):
        j = (i + 1) % len(rows)
        while _norm(rows[j]["answer"]) == _norm(row["answer"]):
            j = (j + 1) % len(rows)
        wrong = _replace_last_boxed(row["solution"], rows[j]["answer"])
        result = math_equal(row["answer"], wrong, timeout_s=TIMEOUT_S)
        if result is not False:
            failures.append((row["unique_id"], row["answer"], rows[j]["answer"], result))
    assert not failures, f"{len(failures)} wrong answers not rejected: {failures[:10]}"


def test_off_by_one_integer_answers_are_rejected(rows):
    integer_rows = [row for row in rows if re.fullmatch(r"-?\d+", row["answer"].strip())]
    assert len(integer_rows) > 200
    failures = []
    for row in integer_rows:
        wrong = _replace_last_boxed(row["solution"], str(int(row["answer"]) + 1))
        if math_equal(row["answer"], wrong, timeout_s=TIMEOUT_S) is not False:
            failures.append(row["unique_id"])
    assert not failures, f"off-by-one answers accepted: {failures[:10]}"
