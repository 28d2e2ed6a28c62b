"""``benchmark=jsonl``: any local JSONL/JSON/Parquet file (or folder of ``<split>.*`` files, or
HF hub id) with a question and an answer per row, in any answer format.

A row gives ``question_field`` (the problem text) and ``answer_field`` (the gold answer, turned
into a string), and optionally ``id_field`` (a unique id; default the row index). The model's
answer is taken from the completion by an **extractor** and compared with the gold by a
**verifier**:

==============  ==================================================================================
extractor       what counts as the answer
==============  ==================================================================================
``boxed``       the content of the last ``\\boxed{...}`` (or last run of boxes, ``verify.boxed_answer``)
``last_number`` the last number written (``1,234`` -> ``1234``)
``regex``       the last match of ``answer_regex`` (its first group if it has one)
``answer_line`` the first number on the first line that starts with ``Answer:`` (lines after it,
                e.g. a free ``Note:``, cannot change the grade; ``conf/benchmark/arith_multiline.yaml``)
``none``        the whole completion, stripped
==============  ==================================================================================

==================  ==============================================================================
verifier            1.0 when
==================  ==============================================================================
``math_verify``     math-verify finds answer and gold equal (under ``verify_timeout_s``)
``exact``           answer == gold after stripping whitespace
``numeric``         both parse as numbers and ``|a - g| <= tolerance * max(1, |g|)``
``pkg.mod:fn``      ``fn(answer, gold)`` returns a true value or a number (None: unscorable)
==================  ==============================================================================

A completion from which the extractor gets nothing scores 0.0. The verifier grades exactly the
extracted answer (``verify_answer``), which is also what samples and eval rows record as
``pred_answer``.

A completion cut off at the token budget (``finish_reason == "length"``) has not stated a final
answer, so ``last_number`` does not fall back to its last number: it takes only a number the
completion marked as final (the last ``\\boxed{}``, ``####``, ``final answer is``), else nothing.
``truncated_last_number=True`` (``benchmark.truncated_last_number``) restores the plain last
number. ``boxed``, ``regex`` and ``none`` read a truncated completion as any other: their match
is already the explicit answer. ``answer_line`` reads a truncated completion only from a complete
``Answer:`` line (one the newline closed), so a number cut in half ("1" of "12") is no answer.
"""

from __future__ import annotations

import re
from itertools import islice
from typing import Any, Callable

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.boxed import BoxedMathBenchmark
from rredcot_cli.benchmarks.verify import boxed_answer, math_equal
from rredcot_cli.errors import RredcotError, one_line
from rredcot_cli.plugins import load_attr
from rredcot_cli.data import read_split
from rredcot_cli.benchmarks.gsm8k import marked_answer

EXTRACTORS = ("boxed", "last_number", "regex", "answer_line", "none")
VERIFIERS = ("math_verify", "exact", "numeric")  # or a user function as module:attr
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
# Forced-answer probes (RREDCoT's answer_probe) per extractor: text the extractor reads back.
# answer_line's probe closes the line: the newline tells "1" from a longer "12", and a segment ends
# with its own newline, so the probe starts the next line as the format's answer line does.
_PROBES = {"boxed": BoxedMathBenchmark.ANSWER_PROBE, "last_number": "\nThe final answer is {answer}",
           "answer_line": "Answer: {answer}\n"}
_ANSWER_LINE = re.compile(r"^[ \t]*Answer:(?P<rest>[^\n]*)(?P<end>\n?)", re.MULTILINE)


def last_number(text: str) -> str | None:
    """The last number in ``text`` with thousands separators removed (``"x = 1,234."`` -> ``"1234"``)."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def answer_line_number(text: str, truncated: bool = False) -> str | None:
    """The first number on the first ``Answer:`` line of ``text`` (None without one); with
    ``truncated``, only from a line the newline closed (the budget may have cut the number)."""
    line = _ANSWER_LINE.search(text)
    if line is None or (truncated and not line.group("end")):
        return None
    number = _NUMBER.search(line.group("rest"))
    return number.group(0).replace(",", "").rstrip(".") if number else None


def _as_number(text: str) -> float | None:
    try:
        return float(text.strip().replace(",", ""))
    except ValueError:
        return None


class JSONLBenchmark:
    """A question/answer file with a configurable extractor and verifier (see the module docstring)."""

    name = "jsonl"
    # A subclass with data packaged in rredcot_cli/data/<name>/ reads it when benchmark.path is null.
    PACKAGED = False

    def __init__(
        self,
        path: str | None = None,
        verify_timeout_s: float = 5.0,
        question_field: str = "question",
        answer_field: str = "answer",
        id_field: str | None = None,
        prompt_template: str | None = None,
        extractor: str = "boxed",
        answer_regex: str | None = None,
        verifier: str = "math_verify",
        tolerance: float = 1e-6,
        truncated_last_number: bool = False,
    ) -> None:
        if extractor not in EXTRACTORS:
            raise RredcotError(f"benchmark.extractor={extractor}: expected one of {', '.join(EXTRACTORS)}")
        self.path = path
        self.verify_timeout_s = verify_timeout_s
        self.question_field, self.answer_field, self.id_field = question_field, answer_field, id_field
        self.extractor, self.verifier, self.tolerance = extractor, verifier, tolerance
        self.truncated_last_number = truncated_last_number
        # Only {question} is replaced, so a template may hold braces (\boxed{}) as they are.
        self.prompt_template = prompt_template or BoxedMathBenchmark.PROMPT_TEMPLATE.format(question="{question}")
        if "{question}" not in self.prompt_template:
            raise RredcotError(f"benchmark.prompt_template={self.prompt_template!r}: must contain {{question}}")
        self.ANSWER_PROBE = _PROBES.get(extractor)
        self._regex = None
        if extractor == "regex":
            if not answer_regex:
                raise RredcotError("benchmark.extractor=regex needs benchmark.answer_regex=PATTERN")
            try:
                self._regex = re.compile(answer_regex)
            except re.error as e:
                raise RredcotError(f"benchmark.answer_regex={answer_regex!r}: not a regular expression ({e})") from None
        self._user_verifier: Callable[[str, str], Any] | None = None
        if verifier not in VERIFIERS:
            if ":" not in verifier:
                raise RredcotError(f"benchmark.verifier={verifier}: expected one of {', '.join(VERIFIERS)} "
                                   f"or a function as module:attr")

            self._user_verifier = load_attr(verifier, "benchmark.verifier")
            if not callable(self._user_verifier):
                raise RredcotError(f"benchmark.verifier={verifier}: not a function")

    def load(self, split: str, limit: int | None = None) -> list[Problem]:
        """Problems of ``split`` in file order (a single file serves every split)."""
        if self.path is None and not self.PACKAGED:
            raise RredcotError("benchmark jsonl needs benchmark.path=FILE (JSONL, JSON or Parquet) or a folder")
        problems, seen = [], set()
        for index, (location, row) in enumerate(islice(read_split(self.name, split, self.path), limit)):
            question, answer = row.get(self.question_field), row.get(self.answer_field)
            if not isinstance(question, str) or answer is None or str(answer).strip() == "":
                raise RredcotError(f"{location}: a row needs a string field '{self.question_field}' and a non-empty "
                                   f"'{self.answer_field}' (benchmark.question_field, benchmark.answer_field)")
            key = str(index) if self.id_field is None else str(row.get(self.id_field, ""))
            if not key or key in seen:
                raise RredcotError(f"{location}: {'missing' if not key else 'duplicate'} id "
                                   f"'{self.id_field}' {key!r} (benchmark.id_field)")
            seen.add(key)
            problems.append(Problem(prompt_id=f"{self.name}/{split}/{key}", question=question,
                                    gold_answer=str(answer).strip(), meta={"index": index}))
        if not problems and limit != 0:
            raise RredcotError(f"benchmark {self.name}: split {split!r} ({self.path}) has no rows")
        return problems

    def prompt(self, problem: Problem) -> str:
        return self.prompt_template.replace("{question}", problem.question)

    def extract_answer(self, completion: str, truncated: bool = False) -> str | None:
        """The answer by ``extractor`` (module docstring); ``truncated``: the completion hit the
        token budget (``last_number`` then needs a final-answer marker)."""
        if self.extractor == "boxed":
            return boxed_answer(completion)
        if self.extractor == "last_number":
            if truncated and not self.truncated_last_number:
                marked = marked_answer(completion)
                return None if marked is None else last_number(marked)
            return last_number(completion)
        if self.extractor == "answer_line":
            return answer_line_number(completion, truncated=truncated)
        if self.extractor == "regex":
            matches = list(self._regex.finditer(completion))
            if not matches:
                return None
            last = matches[-1]
            return (last.group(1) if self._regex.groups else last.group(0)).strip()
        return completion.strip()

    def decided_outcome(self, prefix: str, gold_answer: str) -> float | None:
        """The reward of every completion that starts with ``prefix`` (``benchmarks.base.decided_outcome``),
        or None while later text can still change it. Only ``answer_line`` grading is final before
        the completion ends: once the first ``Answer:`` line is closed by its newline, nothing
        written later changes the grade (an open line may still grow, "1" into "12"). Every other
        extractor reads the last match of the whole completion, so nothing is decided early."""
        if self.extractor != "answer_line":
            return None
        line = _ANSWER_LINE.search(prefix)
        if line is None or not line.group("end"):
            return None
        gold = Problem(prompt_id="", question="", gold_answer=gold_answer)
        return self.verify_answer(answer_line_number(prefix, truncated=True), gold)

    def verify(self, completion: str, problem: Problem, truncated: bool = False) -> float | None:
        """``verify_answer(extract_answer(completion, truncated), problem)``."""
        return self.verify_answer(self.extract_answer(completion, truncated=truncated), problem)

    def verify_answer(self, answer: str | None, problem: Problem) -> float | None:
        """The verifier's score of an extracted ``answer`` (0.0 for None; None: unscorable)."""
        if answer is None:
            return 0.0
        gold = problem.gold_answer
        if self._user_verifier is not None:
            try:
                result = self._user_verifier(answer, gold)
            except Exception as e:  # noqa: BLE001 - user code: one line naming it
                raise RredcotError(f"benchmark.verifier={self.verifier} failed on answer {answer[:80]!r}: "
                                   f"{type(e).__name__}: {one_line(e)}") from e
            return None if result is None else float(result)
        if self.verifier == "exact":
            return float(answer.strip() == gold.strip())
        if self.verifier == "numeric":
            a, g = _as_number(answer), _as_number(gold)
            if g is None:
                return None  # a gold that is not a number: unscorable, not wrong
            return float(a is not None and abs(a - g) <= self.tolerance * max(1.0, abs(g)))

        result = math_equal(gold, "\\boxed{" + answer + "}", timeout_s=self.verify_timeout_s)
        return None if result is None else float(result)


class ArithBenchmark(JSONLBenchmark):
    """``benchmark=arith``: "What is a + b? Answer with a single number." over single digits (sums
    and non-negative differences), packaged in rredcot_cli/data/arith/ and written by
    scripts/make_arith.py. A task where a 135M instruct model's sampled pass@1 has room both ways
    (docs/studies/real-model.md); the question is the whole prompt (no step-by-step instruction), the
    answer the last number (a truncated completion needs "The final answer is"), graded as a number."""

    name = "arith"
    PACKAGED = True

    def __init__(self, path: str | None = None, verify_timeout_s: float = 5.0, prompt_template: str | None = "{question}",
                 extractor: str = "last_number", verifier: str = "numeric", tolerance: float = 1e-6,
                 truncated_last_number: bool = False, id_field: str | None = "id") -> None:
        super().__init__(path=path, verify_timeout_s=verify_timeout_s, prompt_template=prompt_template,
                         extractor=extractor, verifier=verifier, tolerance=tolerance,
                         truncated_last_number=truncated_last_number, id_field=id_field)
