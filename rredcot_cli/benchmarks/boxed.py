"""What the real math benchmarks share: the verl-style ``\\boxed{}`` prompt, the forced-answer
probe, and math-verify checking under a timeout. Subclasses load their rows (and GSM8K widens
``extract_answer``).

One extraction: ``verify`` grades the answer ``extract_answer`` returns, wrapped as
``\\boxed{answer}`` for math-verify, and nothing else; math-verify is never handed the whole
completion, whose own extraction (it favours phrases such as "the answer: 12" over the last
number) would grade another answer than the one recorded in ``pred_answer`` and voted on by
maj@k. No answer scores 0.0.
"""

from __future__ import annotations

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.verify import extract_boxed, math_equal


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
        """The content of the last ``\\boxed{}``, or None. ``\\boxed{}`` is an explicit marker, so a
        truncated completion (``truncated``) is read the same way."""
        return extract_boxed(completion)

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
