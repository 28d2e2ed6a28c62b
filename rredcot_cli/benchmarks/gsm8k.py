"""GSM8K (Cobbe et al., 2021): grade-school word problems with an integer answer after ``####``.

Rows have ``question`` and ``answer`` (a worked solution ending in ``#### <number>``); the gold is
the number after ``####`` with thousands separators removed. The answer of a completion is, in
this order: the boxed answer (the content of the last ``\\boxed{}``, or of the last run of boxes
that only connectors separate, ``verify.boxed_answer``); else the number after the last
explicit final-answer marker (``####`` or ``final answer is``/``final answer:``,
case-insensitive); else the last number of the completion. That one answer is recorded as ``pred_answer`` and checked
with math-verify (``rredcot_cli.benchmarks.verify.math_equal``) against the gold.

A completion cut off at the token budget (``truncated``: ``finish_reason == "length"``) has not
stated a final answer unless it wrote a marker, so it gets no last-number fallback: without a
``\\boxed{}`` or marker its answer is None and it scores 0.0 (verl's default "strict" GSM8K
extraction scores it so too). ``truncated_last_number=True`` (``benchmark.truncated_last_number``)
restores the fallback for truncated completions.
"""

from __future__ import annotations

import re
from itertools import islice

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.boxed import BoxedMathBenchmark
from rredcot_cli.data import read_split
from rredcot_cli.errors import RredcotError
from rredcot_cli.benchmarks.verify import boxed_answer

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
# An explicit final-answer marker and the number it introduces ("#### 1,234", "The final answer
# is $12$", "Final answer: **7**").
_MARKED = re.compile(r"(?:####|\bfinal\s+answer(?:\s+is)?\s*:?)[\s$*\\]*(" + _NUMBER.pattern + ")", re.IGNORECASE)


def parse_gold(answer_field: str) -> str:
    """The final answer of a GSM8K ``answer`` field: the text after the last ``####``, commas removed."""
    if "####" not in answer_field:
        raise ValueError("no '####' before the final answer")
    gold = answer_field.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise ValueError("nothing after '####'")
    return gold


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (commas removed, trailing '.' dropped), or None."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "")


def marked_answer(text: str) -> str | None:
    """The answer ``text`` states explicitly: the boxed answer (the last run of ``\\boxed{}``,
    ``verify.boxed_answer``), else the number after the last ``####`` / ``final answer is`` marker
    (commas removed), else None."""
    boxed = boxed_answer(text)
    if boxed is not None:
        return boxed
    matches = _MARKED.findall(text)
    return matches[-1].replace(",", "") if matches else None


class GSM8KBenchmark(BoxedMathBenchmark):
    """The GSM8K benchmark (splits ``train`` and ``test`` are packaged)."""

    name = "gsm8k"
    # Config used when ``path`` is an HF hub id without ``:<config>`` (openai/gsm8k has main/socratic).
    HUB_CONFIG = "main"

    def __init__(self, path: str | None = None, verify_timeout_s: float = 5.0,
                 truncated_last_number: bool = False) -> None:
        super().__init__(path=path, verify_timeout_s=verify_timeout_s)
        self.truncated_last_number = truncated_last_number

    def load(self, split: str, limit: int | None = None) -> list[Problem]:
        """Problems of ``split`` in file order; the first ``limit`` if given."""
        problems = []
        records = read_split(self.name, split, self.path, hub_config=self.HUB_CONFIG)
        for index, (location, row) in enumerate(islice(records, limit)):
            question, answer = row.get("question"), row.get("answer")
            if not isinstance(question, str) or not isinstance(answer, str):
                raise RredcotError(f"{location}: a GSM8K row needs string fields 'question' and 'answer'")
            try:
                gold = parse_gold(answer)
            except ValueError as exc:
                raise RredcotError(f"{location}: malformed GSM8K answer: {exc}") from None
            problems.append(
                Problem(prompt_id=f"{self.name}/{split}/{index}", question=question, gold_answer=gold, meta={"index": index})
            )
        if not problems and limit != 0:
            raise RredcotError(f"benchmark {self.name}: split {split!r} ({self.path or 'packaged copy'}) has no rows")
        return problems

    def extract_answer(self, completion: str, truncated: bool = False) -> str | None:
        """The last ``\\boxed{}`` content, else the number after the last ``####`` / ``final answer
        is`` marker, else (unless ``truncated`` and not ``truncated_last_number``) the last number
        in the completion, else None."""
        answer = marked_answer(completion)
        if answer is not None or (truncated and not self.truncated_last_number):
            return answer
        return last_number(completion)
