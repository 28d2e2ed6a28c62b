"""GSM8K (Cobbe et al., 2021): grade-school word problems with an integer answer after ``####``.

Rows have ``question`` and ``answer`` (a worked solution ending in ``#### <number>``); the gold is
the number after ``####`` with thousands separators removed. Completions are checked with
math-verify (``rredcot_cli.verify.math_equal``) against the gold; the answer is the last
``\\boxed{}``, or, without one, the final number of the completion.
"""

from __future__ import annotations

import re
from itertools import islice

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.boxed import BoxedMathBenchmark
from rredcot_cli.data import read_split
from rredcot_cli.errors import RredcotError
from rredcot_cli.verify import extract_boxed

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


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


class GSM8KBenchmark(BoxedMathBenchmark):
    """The GSM8K benchmark (splits ``train`` and ``test`` are packaged)."""

    name = "gsm8k"
    # Config used when ``path`` is an HF hub id without ``:<config>`` (openai/gsm8k has main/socratic).
    HUB_CONFIG = "main"

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

    def extract_answer(self, completion: str) -> str | None:
        """The last ``\\boxed{}`` content, else the last number in the completion, else None."""
        boxed = extract_boxed(completion)
        if boxed is not None:
            return boxed
        return last_number(completion)
