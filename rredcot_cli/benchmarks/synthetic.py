"""Deterministic synthetic benchmarks whose chains can be checked line by line.

``chain`` (chained arithmetic mod 10; an error anywhere ruins the answer)::

    prompt:      Compute mod 10: 7 +3 *4 -8 +5
    completion:  7+3=0
                 0*4=0
                 0-8=2
                 2+5=7
                 Answer: 7

``chain_verbose`` poses the same problems as ``chain`` with ~70-100-token step lines
(``Step 1: we have 7, the operations left are +3 *2, so mod 10 we get 7+3=0.``), a long chain of thought
with as many decisions as a short one.

``chain_tail`` poses the ``chain`` problems with the ``chain`` solution followed by ``tail_lines``
free-text lines after the graded ``Answer:`` line (``Note: sand 7 moon red``), segments that cannot
change the outcome: where theory says segment-level credit pays (issue 39, item 5).

``search`` (trial and check; the answer is fixed by the one line that says ``yes``)::

    prompt:      Find the first x in 3 8 1 5 with (7x+2)%10=7
    completion:  x=3: 3 no
                 x=8: 8 no
                 x=1: 9 no
                 x=5: 7 yes
                 Answer: 5

Each step line is fully determined by the problem, so a step is right iff the line equals the gold
line (surrounding whitespace ignored). Step lines are the non-blank lines before the first
``Answer:`` line; anything after that line is ignored.

Splits are disjoint by construction: a candidate problem belongs to a split only if a hash of its
question falls in that split's buckets, and each split draws candidates from its own seeded stream.
"""

from __future__ import annotations

import hashlib
import random
import re

from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.errors import RredcotError

MOD = 10
ANSWER_PREFIX = "Answer:"

# Share of the question-hash buckets (out of 100) each split owns; disjoint.
_SPLIT_BUCKETS = {"train": range(0, 80), "validation": range(80, 90), "test": range(90, 100)}


class BenchmarkSplitError(RredcotError, ValueError):
    """An unknown split name: one line for the CLI, still a ValueError for callers."""


class BenchmarkSettingError(RredcotError, ValueError):
    """A synthetic benchmark option out of its range: one line for the CLI, still a ValueError."""


def _bucket(question: str) -> int:
    return int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 100


def _split_rng(name: str, data_seed: int, split: str) -> random.Random:
    if split not in _SPLIT_BUCKETS:
        raise BenchmarkSplitError(f"benchmark {name} has no split {split!r}; valid splits: {', '.join(sorted(_SPLIT_BUCKETS))}")
    # str seeds are hashed with SHA-512 by `random`, so this is stable across processes.
    return random.Random(f"{name}/{data_seed}/{split}")


def _lines_with_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) spans of every line of ``text``, newline characters excluded."""
    spans = []
    start = 0
    for match in re.finditer("\n", text):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(text)))
    return spans


def step_char_spans(completion: str) -> list[tuple[int, int]]:
    """Spans of the non-blank lines before the first ``Answer:`` line (newlines excluded)."""
    spans = []
    for start, end in _lines_with_spans(completion):
        line = completion[start:end]
        if line.strip().startswith(ANSWER_PREFIX):
            break
        if line.strip():
            spans.append((start, end))
    return spans


def extract_answer(completion: str) -> str | None:
    """The text after ``Answer:`` on the first answer line, stripped; None if absent or empty."""
    for start, end in _lines_with_spans(completion):
        line = completion[start:end].strip()
        if line.startswith(ANSWER_PREFIX):
            answer = line[len(ANSWER_PREFIX):].strip()
            return answer or None
    return None


def first_wrong_line(completion: str, gold_lines: list[str]) -> int | None:
    """0-based index of the first step line that differs from ``gold_lines``, None if all match.

    A missing line (the chain stops early) counts as wrong at its index; so does an extra line
    after all gold lines.
    """
    spans = step_char_spans(completion)
    lines = [completion[s:e].strip() for s, e in spans]
    for k in range(max(len(lines), len(gold_lines))):
        if k >= len(lines) or k >= len(gold_lines) or lines[k] != gold_lines[k]:
            return k
    return None


class _SyntheticBase:
    """Shared plumbing: deterministic split streams, answer parsing, verification."""

    name = "synthetic"
    # The seeded stream problems are drawn from; a variant that only changes the solution format
    # keeps its parent's family, so it poses exactly the same problems in every split.
    problem_family = "synthetic"
    # Forced-answer probe for value estimation (RREDCoT answer_probe); prefixes end at a line.
    ANSWER_PROBE = "Answer: {answer}{eos}"

    def __init__(self, min_steps: int, max_steps: int, data_seed: int):
        if not 1 <= min_steps <= max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
        self.min_steps = min_steps
        self.max_steps = max_steps
        self.data_seed = data_seed

    # -- to be provided by subclasses -------------------------------------------------------
    def _sample(self, rng: random.Random, steps: int) -> tuple[str, str, dict]:
        """(question, gold_answer, meta) of one random problem with ``steps`` step lines."""
        raise NotImplementedError

    def _lines(self, problem: Problem, error_rate: float, rng: random.Random | None) -> tuple[list[str], str]:
        """Step lines and final answer; each step is miscomputed with probability ``error_rate``."""
        raise NotImplementedError

    def gold_lines(self, problem: Problem) -> list[str]:
        """The gold step lines (no newlines), one per step."""
        return self._lines(problem, 0.0, None)[0]

    # -- the Benchmark protocol -------------------------------------------------------------
    def load(self, split: str, limit: int | None = None) -> list[Problem]:
        """Problems of ``split`` in a fixed order; ``load(s, n)`` is a prefix of ``load(s, m>n)``.

        Without ``limit`` a synthetic split has 1000 problems.
        """
        count = 1000 if limit is None else limit
        rng = _split_rng(self.problem_family, self.data_seed, split)
        buckets = _SPLIT_BUCKETS[split]
        problems: list[Problem] = []
        while len(problems) < count:
            steps = rng.randint(self.min_steps, self.max_steps)
            question, answer, meta = self._sample(rng, steps)
            if _bucket(question) not in buckets:
                continue
            pid = f"{self.name}/{split}/{len(problems)}"
            problems.append(Problem(prompt_id=pid, question=question, gold_answer=answer, meta=meta))
        return problems

    def prompt(self, problem: Problem) -> str:
        return problem.question + "\n"

    def solution(self, problem: Problem, error_rate: float = 0.0, rng: random.Random | None = None) -> str:
        """The gold completion: one step per line, then ``Answer: <x>`` (no trailing newline).

        With ``error_rate`` > 0 (SFT data only), each step's computed value is replaced by a wrong
        one with that probability (drawn from ``rng``) and the chain carries on consistently from
        the written value, as a model that slipped would. This keeps a trained model's sampled
        accuracy below 100% on purpose; ``error_rate=0`` gives the gold solution.
        """
        if error_rate > 0 and rng is None:
            raise ValueError("error_rate > 0 needs an rng")
        lines, answer = self._lines(problem, error_rate, rng)
        return "".join(line + "\n" for line in lines) + f"{ANSWER_PREFIX} {answer}"

    def extract_answer(self, completion: str) -> str | None:
        return extract_answer(completion)

    def verify(self, completion: str, problem: Problem) -> float:
        return 1.0 if extract_answer(completion) == problem.gold_answer else 0.0

    def decided_outcome(self, prefix: str, gold_answer: str) -> float | None:
        """The reward of every completion that starts with ``prefix``, or None while undecided.

        Grading reads the first ``Answer:`` line, so once that line is complete (a newline
        follows it) nothing written later changes the reward; a last line without its newline is
        still open ("Answer: 1" may go on to "Answer: 12")."""
        complete = prefix[: prefix.rfind("\n") + 1]
        if not any(line.strip().startswith(ANSWER_PREFIX) for line in complete.split("\n")):
            return None
        return 1.0 if extract_answer(complete) == gold_answer else 0.0

    def first_wrong_step(self, completion: str, problem: Problem) -> int | None:
        return first_wrong_line(completion, self.gold_lines(problem))

    def step_char_spans(self, completion: str) -> list[tuple[int, int]]:
        return step_char_spans(completion)


def apply_op(a: int, op: str, b: int) -> int:
    """``a op b`` mod 10 for op in ``+ - *``."""
    if op == "+":
        return (a + b) % MOD
    if op == "-":
        return (a - b) % MOD
    if op == "*":
        return (a * b) % MOD
    raise ValueError(f"unknown op {op!r}")


class ChainBenchmark(_SyntheticBase):
    """Chained arithmetic mod 10: one ``a<op>b=c`` line per step, then ``Answer: <c>``.

    meta: ``steps`` (int), ``start`` (int), ``ops`` (list of strings like ``"+3"``).
    Multipliers avoid 0, 1 and 5 so a product rarely erases the history of the chain.
    """

    name = "chain"
    problem_family = "chain"
    _PROMPT_HEAD = "Compute mod 10:"
    _OPERANDS = {"+": range(1, 10), "-": range(1, 10), "*": (2, 3, 4, 6, 7, 8, 9)}

    def __init__(self, min_steps: int = 4, max_steps: int = 12, data_seed: int = 1234):
        super().__init__(min_steps, max_steps, data_seed)

    def _sample(self, rng: random.Random, steps: int) -> tuple[str, str, dict]:
        start = rng.randrange(MOD)
        ops = []
        for _ in range(steps):
            op = rng.choice("+-*")
            ops.append(f"{op}{rng.choice(self._OPERANDS[op])}")
        value = start
        for item in ops:
            value = apply_op(value, item[0], int(item[1:]))
        question = f"{self._PROMPT_HEAD} {start} " + " ".join(ops)
        return question, str(value), {"steps": steps, "start": start, "ops": ops}

    def _lines(self, problem: Problem, error_rate: float, rng: random.Random | None) -> tuple[list[str], str]:
        lines = []
        value = problem.meta["start"]
        for item in problem.meta["ops"]:
            op, b = item[0], int(item[1:])
            new = apply_op(value, op, b)
            if error_rate > 0 and rng.random() < error_rate:
                new = rng.choice([d for d in range(MOD) if d != new])
            lines.append(self._line(len(lines) + 1, value, op, b, new, problem.meta["ops"][len(lines):]))
            value = new
        return lines, str(value)

    @staticmethod
    def _line(step: int, value: int, op: str, operand: int, result: int, remaining: list[str]) -> str:
        """Step ``step``'s line; ``remaining`` is the operations from this one to the end."""
        return f"{value}{op}{operand}={result}"


class ChainVerboseBenchmark(ChainBenchmark):
    """The ``chain`` problems (same questions, same splits; the prompt adds "step by step in
    words") with a verbose step line that carries the operations still to do::

        Step 3: we have 0, the operations left are -8 *3 +2, so mod 10 we get 0-8=2.

    Each line makes the decisions a ``chain`` line makes (carry the running value, take the next
    operation, compute it) plus the step number, wrapped in words that are predictable once
    learned and the list of operations left, copied from the line above minus its first entry.
    That list is why this format is learnable by the tiny models: the next operation is read
    from the previous line, not looked up hundreds of tokens back in the prompt, which a model
    fine-tuned on a lookup format (``the next operation is -8``) never learned past step 4
    (docs/studies/long-chains.md, Amendment 3). A chain of 4-12 steps is ~300-1,000 tokens instead of
    ~60: a long chain of thought in which few tokens are decisive.
    """

    name = "chain_verbose"
    # The prompt says which format is wanted, so one model can be trained on both (rehearsing
    # `chain` keeps its arithmetic) and still tell them apart; the problem itself is unchanged.
    PROMPT_CUE = ", step by step in words"

    def prompt(self, problem: Problem) -> str:
        return problem.question + self.PROMPT_CUE + "\n"

    @staticmethod
    def _line(step: int, value: int, op: str, operand: int, result: int, remaining: list[str]) -> str:
        return (f"Step {step}: we have {value}, the operations left are {' '.join(remaining)}, "
                f"so mod 10 we get {value}{op}{operand}={result}.")


class ChainTailBenchmark(ChainBenchmark):
    """The ``chain`` problems (same questions, same splits; the prompt adds "with notes") whose
    solution is the ``chain`` solution followed by ``tail_lines`` free-text lines::

        7+3=0
        0*4=0
        Answer: 0
        Note: sand 7 moon red
        Note: fish 2 rain tree
        ...

    The tail comes after the graded ``Answer:`` line, so nothing written there changes the reward
    (grading reads the first ``Answer:`` line, never the last number). Its words and digits are
    drawn at random, so a model fine-tuned on it writes high-entropy text that is irrelevant to
    the outcome: the segments an outcome-level advantage credits with pure noise and a good
    segment-level estimator should credit with ~0. Gold solutions draw their tail from a stream
    seeded by the question (the same problem always gets the same gold text); SFT data with
    ``error_rate`` > 0 draws it from the SFT rng, so every example's tail is fresh (the tail has
    no errors to inject: any text there is as right as any other).
    """

    name = "chain_tail"
    PROMPT_CUE = ", with notes"
    TAIL_PREFIX = "Note:"
    # The forced answer the way this format writes it: the Answer line ends with a newline (the
    # Notes follow), never with end-of-text, so the inherited "Answer: {answer}{eos}" would score an
    # ending the model was trained never to write right there (issue 37, item 4).
    ANSWER_PROBE = "Answer: {answer}\n"
    # Short lowercase words, none a prefix of "Answer:", all inside the character tokenizer.
    TAIL_WORDS = ("red", "blue", "cat", "dog", "sun", "moon", "tree", "fish", "bird", "rain", "star", "sand")

    def __init__(self, min_steps: int = 4, max_steps: int = 12, data_seed: int = 1234, tail_lines: int = 4):
        super().__init__(min_steps, max_steps, data_seed)
        if not isinstance(tail_lines, int) or tail_lines < 0:
            raise BenchmarkSettingError(f"benchmark chain_tail needs benchmark.options.tail_lines >= 0 (an integer), got {tail_lines!r}")
        self.tail_lines = tail_lines

    def prompt(self, problem: Problem) -> str:
        return problem.question + self.PROMPT_CUE + "\n"

    def tail(self, rng: random.Random) -> list[str]:
        """``tail_lines`` lines ``Note: <word> <digit> <word> <word>`` drawn from ``rng``."""
        words = self.TAIL_WORDS
        return [f"{self.TAIL_PREFIX} {rng.choice(words)} {rng.randrange(MOD)} {rng.choice(words)} {rng.choice(words)}"
                for _ in range(self.tail_lines)]

    def solution(self, problem: Problem, error_rate: float = 0.0, rng: random.Random | None = None) -> str:
        """The ``chain`` solution, then a newline and the tail lines (no trailing newline)."""
        chain = super().solution(problem, error_rate, rng)
        # str seeds are hashed with SHA-512 by `random`: the gold tail is stable across processes.
        # error_rate 0 is the gold solution whatever rng is given (the synthetic contract).
        tail_rng = rng if error_rate > 0 else random.Random(f"{self.name}/tail/{problem.question}")
        return "\n".join([chain, *self.tail(tail_rng)])


class SearchBenchmark(_SyntheticBase):
    """Find the first candidate x with (a*x+b) % 10 == c; one ``x=<x>: <f(x)> no|yes`` line per trial.

    The candidate list has ``steps`` digits: ``steps - 1`` that fail, then the solution, so the
    number of trials equals ``steps`` and the last trial is the only ``yes``.
    meta: ``steps``, ``a``, ``b``, ``c`` (ints) and ``candidates`` (list of ints).
    """

    name = "search"
    problem_family = "search"

    def __init__(self, min_steps: int = 4, max_steps: int = 12, data_seed: int = 1234):
        super().__init__(min_steps, max_steps, data_seed)

    @staticmethod
    def f(a: int, b: int, x: int) -> int:
        return (a * x + b) % MOD

    def _sample(self, rng: random.Random, steps: int) -> tuple[str, str, dict]:
        a = rng.randrange(1, MOD)
        b = rng.randrange(MOD)
        x_star = rng.randrange(MOD)
        c = self.f(a, b, x_star)
        misses = [x for x in range(MOD) if self.f(a, b, x) != c]  # non-empty since a != 0 mod 10
        candidates = [rng.choice(misses) for _ in range(steps - 1)] + [x_star]
        question = f"Find the first x in {' '.join(map(str, candidates))} with ({a}x+{b})%10={c}"
        meta = {"steps": steps, "a": a, "b": b, "c": c, "candidates": candidates}
        return question, str(x_star), meta

    def _lines(self, problem: Problem, error_rate: float, rng: random.Random | None) -> tuple[list[str], str]:
        m = problem.meta
        lines = []
        for x in m["candidates"]:
            fx = self.f(m["a"], m["b"], x)
            if fx != m["c"] and error_rate > 0 and rng.random() < error_rate:
                # a miscomputed failing trial: a wrong value that still fails (verdict stays "no")
                fx = rng.choice([d for d in range(MOD) if d not in (fx, m["c"])])
            lines.append(f"x={x}: {fx} {'yes' if fx == m['c'] else 'no'}")
        return lines, problem.gold_answer
