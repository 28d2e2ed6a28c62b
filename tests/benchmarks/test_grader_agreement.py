"""The grader against labels nobody here made: keeps the labelled agreement where it is.

Three labelled sets, all public, licences checked:

* ``data/math_verify/cases.json``: 105 graded (gold, completion) cases from the test suite of
  huggingface/Math-Verify (commit 5d148cf), those whose completion has a ``\\boxed{}`` or a "final
  answer is" / "the answer is" statement; most completions are real model outputs collected by the
  Math-Verify authors. Apache-2.0 (the repository; ``data/math_verify/LICENCE-Apache-2.0``) and MIT
  (the cases from its tests/test_all.py; ``data/math_verify/LICENCE-MIT-test_all``). Rebuilt by
  reading the ``@pytest.mark.parametrize("gold, pred, expected", ...)`` lists of that commit's
  tests/*.py, without the strict=False and set-relation variants.
* GSM8K (MIT, ``rredcot_cli/data/gsm8k/LICENSE``): the 75 solutions (59 train, 16 test) whose
  last line states the answer with a percent sign ("... = 20%.\\n#### 20"). Their answer boxed as
  they write it (``\\boxed{20\\%}``) is labelled right against the ``####`` gold, the next integer
  wrong.
* MATH-500 (MIT, ``rredcot_cli/data/math500/LICENSE``): every gold solution with its boxes taken
  off and a last line in lm-eval's minerva_math format ("Final Answer: The final answer is
  $<answer>$. I hope it is correct.") is labelled right; the same solution stating the next
  problem's (different) answer is labelled wrong (its body still holds the right answer, unboxed:
  the statement must be graded, not the text before it).

Measured (about 80 s on 2 shared cores), main at 9706c73 -> this branch:

==================================================  ==========  ==========
set                                                  main        now
==================================================  ==========  ==========
Math-Verify cases, one ``\\boxed{}``                  75/77       75/77
Math-Verify cases, several ``\\boxed{}``              4/16        14/16
Math-Verify cases, no box, a stated answer            1/12        8/12
Math-Verify cases labelled wrong but accepted         0           0
GSM8K percent answers accepted / wrong rejected      0/75 75/75  75/75 75/75
MATH-500 stated answers accepted / wrong rejected    0/500 500   500/500 500
==================================================  ==========  ==========
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.gsm8k import parse_gold

ROOT = Path(__file__).resolve().parents[2]
MATH_VERIFY_CASES = Path(__file__).resolve().parent / "data" / "math_verify" / "cases.json"
TIMEOUT_S = 10.0
# The agreement this branch measured; a change to the grader may raise these, never lower them.
MIN_AGREEMENT = {"one box": 75, "several boxes": 14, "stated, no box": 8}
# "... = 20%.\n#### 20": a GSM8K solution whose last line ends in the answer with a percent sign.
_PERCENT_LAST_LINE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s*%\s*\.?\s*\n####")


def _problem(gold: str) -> Problem:
    return Problem(prompt_id="t/0", question="q", gold_answer=gold, meta={})


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _group(completion: str) -> str:
    boxes = completion.count("\\boxed")
    return "one box" if boxes == 1 else "several boxes" if boxes > 1 else "stated, no box"


@pytest.fixture(scope="module")
def math500():
    return make_benchmark("math500", verify_timeout_s=TIMEOUT_S)


def test_math_verify_labelled_cases(math500):
    cases = json.loads(MATH_VERIFY_CASES.read_text(encoding="utf-8"))["cases"]
    assert len(cases) == 105
    agree = {group: 0 for group in MIN_AGREEMENT}
    false_positives = []
    for case in cases:
        accepted = math500.verify(case["completion"], _problem(case["gold"])) == 1.0
        agree[_group(case["completion"])] += accepted == bool(case["label"])
        if accepted and not case["label"]:
            false_positives.append((case["source"], case["gold"], case["completion"][-120:]))
    assert not false_positives, f"completions labelled wrong were accepted: {false_positives}"
    below = {g: (agree[g], n) for g, n in MIN_AGREEMENT.items() if agree[g] < n}
    assert not below, f"agreement fell (got, was): {below}"


def _gsm8k_percent_rows() -> list[tuple[str, str, str]]:
    """(solution body, number as written with %, gold) of every GSM8K solution ending in "N%"."""
    found = []
    for split in ("train", "test"):
        for row in _rows(ROOT / "rredcot_cli" / "data" / "gsm8k" / f"{split}.jsonl"):
            match = _PERCENT_LAST_LINE.search(row["answer"])
            if match:
                found.append((row["answer"][: match.start()], match.group(1), parse_gold(row["answer"])))
    return found


def test_gsm8k_percent_answers():
    bench = make_benchmark("gsm8k", verify_timeout_s=TIMEOUT_S)
    rows = _gsm8k_percent_rows()
    assert len(rows) == 75
    not_accepted, not_rejected = [], []
    for body, written, gold in rows:
        if bench.verify(f"{body}\\boxed{{{written}\\%}}", _problem(gold)) != 1.0:
            not_accepted.append((written, gold))
        wrong = str(int(float(gold.replace(",", ""))) + 1)
        if bench.verify(f"{body}\\boxed{{{wrong}\\%}}", _problem(gold)) != 0.0:
            not_rejected.append((wrong, gold))
    assert not not_accepted, f"{len(not_accepted)} right percent answers rejected: {not_accepted[:5]}"
    assert not not_rejected, f"{len(not_rejected)} wrong percent answers accepted: {not_rejected[:5]}"


def _unboxed(solution: str) -> str:
    """``solution`` with every ``\\boxed{x}`` replaced by ``x`` (MATH solutions escape no braces
    inside their boxes, so counting braces finds each box's end)."""
    while (start := solution.rfind("\\boxed{")) >= 0:
        depth, end = 0, start + len("\\boxed")
        for end in range(end, len(solution)):
            depth += {"{": 1, "}": -1}.get(solution[end], 0)
            if depth == 0:
                break
        solution = solution[:start] + solution[start + len("\\boxed{") : end] + solution[end + 1 :]
    return solution


def _norm(answer: str) -> str:
    """Whitespace-free answer without a leading ``x=``-style assignment (``x=5`` means ``5``)."""
    return re.sub(r"^[a-zA-Z]=", "", "".join(answer.split()))


def _minerva(body: str, answer: str) -> str:
    return f"{body}\nFinal Answer: The final answer is ${answer}$. I hope it is correct."


def test_math500_stated_answers_without_a_box(math500):
    rows = _rows(ROOT / "rredcot_cli" / "data" / "math500" / "test.jsonl")
    not_accepted, not_rejected = [], []
    for i, row in enumerate(rows):
        body, problem = _unboxed(row["solution"]), _problem(row["answer"])
        if math500.verify(_minerva(body, row["answer"]), problem) != 1.0:
            not_accepted.append(row["unique_id"])
        j = (i + 1) % len(rows)
        while _norm(rows[j]["answer"]) == _norm(row["answer"]):
            j = (j + 1) % len(rows)
        other = rows[j]["answer"]
        if math500.verify(_minerva(body, other), problem) != 0.0:
            not_rejected.append((row["unique_id"], row["answer"], other))
    assert not not_accepted, f"{len(not_accepted)} stated right answers rejected: {not_accepted[:10]}"
    assert not not_rejected, f"{len(not_rejected)} stated wrong answers accepted: {not_rejected[:10]}"
