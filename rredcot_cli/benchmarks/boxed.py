"""What the real math benchmarks share: the verl-style ``\\boxed{}`` prompt, the forced-answer
probe, and math-verify checking under a timeout. Subclasses load their rows (and GSM8K widens
``extract_answer``).

One extraction: ``verify`` grades the answer ``extract_answer`` returns, wrapped as
``\\boxed{answer}`` for math-verify, and nothing else; math-verify is never handed the whole
completion, whose own extraction (it favours phrases such as "the answer: 12" over the last
number) would grade another answer than the one recorded in ``pred_answer`` and voted on by
maj@k. The answer is the boxed one (the last run of ``\\boxed{}``), else one stated after "final
answer is" / "the answer is" (``stated_answer``); the grading decisions and their evidence are in
``rredcot_cli.benchmarks.verify``'s docstring. No answer scores 0.0.
"""

from __future__ import annotations

import re

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.verify import boxed_answer, math_equal

# An explicit statement of the final answer without a box: "The final answer is $x$", "the
# answer is 12.", "Final Answer: $\frac{1}{2}$" (lm-eval's minerva_math format and the phrases
# Qwen2.5-Math's grader reads when there is no box); why, in verify.py's "Grading decisions".
# (No two \s* side by side before "is"/":": a long run of spaces must not backtrack quadratically.)
_STATEMENT = re.compile(r"\b(?:final\s+answer|the\s+answer)\s*(?:\*\*\s*)?(?:is\b\s*:?|:)\s*(?:\*\*\s*)?", re.IGNORECASE)
# The answer right after a statement: a math span ($...$, $$...$$, \(...\), \[...\]) ...
# (an escaped \$ inside is a dollar sign, not the closing delimiter).
_STATED_MATH = re.compile(
    r"\$\$(.{1,500}?)(?<!\\)\$\$|\$(.{1,500}?)(?<!\\)\$|\\\((.{1,500}?)\\\)|\\\[(.{1,500}?)\\\]", re.DOTALL
)
# ... or one bare token with a digit and no letters ("12,000,023.", "2/3"): prose ("the volume is
# 120") is not read as an answer.
_STATED_TOKEN = re.compile(r"([^\s$]{1,200}?)[.,;:*]*(?=\s|$)")
_NUMBER_LIKE = re.compile(r"[^A-Za-z]*\d[^A-Za-z]*")  # a digit, and no letters


# PRM800K's format (OpenAI's GPT-4 MATH solutions): a "# Answer" heading, then the answer alone on
# its line ("...\n\n# Answer\n\n320,000"); the whole line is the answer.
_ANSWER_HEADING = re.compile(r"^\#{1,6}[ \t]*answer[ \t]*:?[ \t]*\n\s*([^\n]{1,300})(\n|$)", re.IGNORECASE | re.MULTILINE)


def stated_answer(text: str, truncated: bool = False) -> str | None:
    """The answer after the last "final answer is" / "the answer is" / "Final Answer:" of ``text``:
    the math span that follows it, else the single token that follows it if it has digits and no
    letters (a number or a formula such as ``2/3``), else None; or, when a "# Answer" heading comes
    later, the line under it. A ``truncated`` completion's trailing token or line may be cut short
    ("12" of "125"), so there only a closed math span, or a finished line, counts."""
    statements = list(_STATEMENT.finditer(text))
    headings = list(_ANSWER_HEADING.finditer(text))
    if headings and (not statements or headings[-1].start() > statements[-1].start()):
        line = headings[-1]
        if truncated and not line.group(2):
            return None
        answer = line.group(1).strip()
        math = _STATED_MATH.fullmatch(answer)
        return next(group for group in math.groups() if group is not None).strip() if math else answer
    if not statements:
        return None
    rest = text[statements[-1].end() :]
    math = _STATED_MATH.match(rest)
    if math is not None:
        answer = next(group for group in math.groups() if group is not None).strip()
        return answer or None
    token = _STATED_TOKEN.match(rest)
    if token is None or not _NUMBER_LIKE.fullmatch(token.group(1)):
        return None
    if truncated and token.end() == len(rest):
        return None
    return token.group(1)


class BoxedMathBenchmark:
    name = "boxed_math"
    # verl-style math prompt; ``{question}`` is the problem text.
    PROMPT_TEMPLATE = "{question}\nLet's think step by step and output the final answer within \\boxed{{}}."
    # Forced-answer probe for value estimation (RREDCoT answer_probe): the part from {answer} on
    # is scored after a prefix of the chain of thought.
    ANSWER_PROBE = "\nThe final answer is $\\boxed{{answer}}$"

    def __init__(self, path: str | None = None, verify_timeout_s: float = 5.0) -> None:
        self.path = path
        self.verify_timeout_s = verify_timeout_s

    def prompt(self, problem: Problem) -> str:
        """The question followed by the step-by-step / ``\\boxed{}`` instruction."""
        return self.PROMPT_TEMPLATE.format(question=problem.question)

    def extract_answer(self, completion: str, truncated: bool = False) -> str | None:
        """The boxed answer (the last run of ``\\boxed{}``, ``verify.boxed_answer``), else the answer
        stated after the last "final answer is" / "the answer is" (``stated_answer``), else None.
        Both are explicit markers, so a truncated completion (``truncated``) is read the same way,
        except for a bare token at its very end."""
        boxed = boxed_answer(completion)
        if boxed is not None:
            return boxed
        return stated_answer(completion, truncated=truncated)

    def verify_answer(self, answer: str | None, problem: Problem) -> float | None:
        """1.0 / 0.0 from math-verify for an extracted ``answer`` against the gold (0.0 for None);
        None if the check timed out or failed."""
        if answer is None:
            return 0.0
        result = math_equal(problem.gold_answer, "\\boxed{" + answer + "}", timeout_s=self.verify_timeout_s)
        if result is None:
            return None
        return 1.0 if result else 0.0

    def verify(self, completion: str, problem: Problem, truncated: bool = False) -> float | None:
        """``verify_answer(extract_answer(completion, truncated), problem)``."""
        return self.verify_answer(self.extract_answer(completion, truncated=truncated), problem)
