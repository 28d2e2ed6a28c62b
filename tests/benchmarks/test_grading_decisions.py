"""The three grading decisions of rredcot_cli.benchmarks.verify's docstring, on hand-written cases.

1. A percent sign on a plain-number answer (or gold) does not make it wrong.
2. Several boxes: the last run of boxes that only connectors separate is the answer (a multi-part
   answer, or one answer restated); a hedge ("\\boxed{2} or \\boxed{3}") is not rewarded; a box
   followed by prose and another box is an intermediate result, only the last box counts.
3. An unboxed MATH answer is read after an explicit "final answer is" / "the answer is" or under a
   "# Answer" heading, and from nowhere else (no last number, no last ``$...$``).

Hand-written by the rredcot authors, plus two completions of the shipped SmolLM2-135M-Instruct
(Apache-2.0 model; the output is ours) and one line quoted from openai/prm800k's README (MIT). The labelled agreement on public data is
in test_grader_agreement.py.
"""

from __future__ import annotations

import pytest

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.benchmarks.boxed import stated_answer
from rredcot_cli.benchmarks.verify import boxed_answer


def _problem(gold: str) -> Problem:
    return Problem(prompt_id="t/0", question="q", gold_answer=gold, meta={})


@pytest.fixture(scope="module", params=["math500", "gsm8k"])
def bench(request):
    return make_benchmark(request.param)


# --- 1. percent ---------------------------------------------------------------------------------

@pytest.mark.parametrize("completion, gold", [
    ("so the share is \\boxed{20\\%}.", "20"),
    ("so the share is $\\boxed{20\\%}$", "20"),
    ("\\boxed{20%}", "20"),
    ("\\boxed{20 \\%}", "20"),
    ("\\boxed{12.5\\%}", "12.5"),
    ("\\boxed{20}", "20\\%"),
    ("\\boxed{20}", "20%"),
])
def test_percent_sign_on_a_plain_number_matches(bench, completion, gold):
    assert bench.verify(completion, _problem(gold)) == 1.0


@pytest.mark.parametrize("completion, gold", [
    ("\\boxed{21\\%}", "20"),
    ("\\boxed{2\\%}", "20"),
    ("\\boxed{20\\%}", "\\frac{1}{5}"),  # only plain-number golds are widened
    ("\\boxed{x\\%}", "20"),
])
def test_percent_rule_accepts_nothing_else(completion, gold):
    assert make_benchmark("math500").verify(completion, _problem(gold)) == 0.0


# --- 2. several boxes ---------------------------------------------------------------------------

@pytest.mark.parametrize("completion, gold", [
    ("The solutions are $\\boxed{2}, \\boxed{3}$.", "2, 3"),
    ("$x = \\boxed{-2}$ and $x = \\boxed{1}$", "1,-2"),
    ("\\[\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}\\]", "(2, 2), (6, 2)"),
    ("\\( y_1 = \\boxed{3} \\) and \\( y_2 = \\boxed{5} \\)", "3, 5"),
    # one answer restated in another form (MATH-500 test/number_theory/459's own gold solution)
    ("$\\boxed{15\\frac{39}{40}},$ or $\\boxed{\\frac{639}{40}}$ inches.", "\\frac{639}{40}"),
    # an intermediate box, then prose, then the answer: the last box counts
    ("interest $\\boxed{200}$. So after a year she has $\\boxed{10200}$.", "10200"),
])
def test_several_boxes_accepted(completion, gold):
    assert make_benchmark("math500").verify(completion, _problem(gold)) == 1.0


@pytest.mark.parametrize("completion, gold", [
    ("It is $\\boxed{2}$ or $\\boxed{3}$.", "3"),  # a hedge
    ("$\\boxed{2}, \\boxed{3}, \\boxed{4}$", "2, 3"),  # one part too many
    ("interest $\\boxed{200}$. So after a year she has $\\boxed{10200}$.", "200"),
])
def test_several_boxes_rejected(bench, completion, gold):
    assert bench.verify(completion, _problem(gold)) == 0.0


def test_boxed_answer_joins_only_connected_boxes():
    assert boxed_answer("$\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$") == "1, 2, 3"
    assert boxed_answer("\\boxed{1} so the total is \\boxed{4}") == "4"
    assert boxed_answer("\\boxed{\\boxed{3}}") == "3"
    assert boxed_answer("\\boxed{4} and \\boxed{5") == "4"  # an unclosed box (truncated) is left out
    assert boxed_answer("no box") is None


# --- 3. unboxed MATH answers --------------------------------------------------------------------

@pytest.mark.parametrize("completion, gold", [
    ("... Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
    ("So the answer is $x = 3$.", "3"),
    ("Therefore the answer is 12,000,023.", "12000023"),
    ("The final answer is: \\(\\sqrt{2}\\)", "\\sqrt{2}"),
    ("**Final Answer:** $(1, 2)$", "(1,2)"),
    ("The answer is 2/3.", "\\frac{2}{3}"),
])
def test_stated_unboxed_answer_is_read(completion, gold):
    assert make_benchmark("math500").verify(completion, _problem(gold)) == 1.0


@pytest.mark.parametrize("completion, gold", [
    ("We get $5 + 2 = 7$.", "7"),  # no statement: no last-number / last-$ fallback
    ("The answer is the number of ways, 7.", "7"),  # prose after the statement
    ("The answer is $6$, since $x = 7$ works.", "7"),  # the stated answer is wrong
    ("The answer is $7$. Wait, no: the answer is $8$.", "7"),  # the last statement counts
])
def test_unboxed_answer_without_a_correct_statement_scores_zero(completion, gold):
    assert make_benchmark("math500").verify(completion, _problem(gold)) == 0.0


# A real completion of the shipped SmolLM2-135M-Instruct (rredcot sample, benchmark=math500, seed 0,
# T=1.0, 256 tokens) to MATH-500 test/number_theory/737, gold 284: it only echoes the question's
# number. A last-$...$ fallback would reward it; no statement, so no answer.
SMOLLM2_ECHO = (
    "To find the sum of the proper divisors of $284$, let's start by finding the sum of the proper divisors of "
    "each of those integers which are expressed as a product of the grand prime factorizations characterisitcally "
    "restricted results of other mathematical integers.\n\nlooking at numbers that are powers of 2 divide another "
    "sum of their proper divisors within the condition of only these two numbers raise their absolute value 2 and "
    "remainder of 6.\n\nA sum of multiplicative rotational sum."
)


# Another (seed 1) to test/number_theory/627, gold 3: a wrong derivation whose last number is 3. A
# last-number fallback would reward it.
SMOLLM2_LAST_NUMBER = "$n + 2 = 7 * m \\cdot n + m$\n$n + 2n = n + 2 * 7m$\n$n + 2n = n + 3$"


@pytest.mark.parametrize("completion, gold", [(SMOLLM2_ECHO, "284"), (SMOLLM2_LAST_NUMBER, "3")])
def test_real_unstated_completions_score_zero(completion, gold):
    bench = make_benchmark("math500")
    assert bench.extract_answer(completion) is None
    assert bench.verify(completion, _problem(gold)) == 0.0


# The end of a real GPT-4 solution in PRM800K's format, quoted in the README of openai/prm800k (MIT
# licence, Copyright 2023 OpenAI): the answer under a "# Answer" heading.
PRM800K_END = (
    "So, the greatest common factor is $2^9\\cdot 5^4 = 512\\cdot 625 = 320,\\!000$.\n\n# Answer\n\n320,000"
)


def test_answer_heading_line_is_read():
    bench = make_benchmark("math500")
    assert bench.verify(PRM800K_END, _problem("320000")) == 1.0
    assert bench.verify(PRM800K_END, _problem("32000")) == 0.0
    assert stated_answer(PRM800K_END, truncated=True) is None  # the line may be cut short
    assert stated_answer("# Answer\n\n$\\frac{1}{2}$\n") == "\\frac{1}{2}"
    assert stated_answer("The answer is $4$.\n\n# Answer\n\n5") == "5"  # the later one counts


def test_a_box_comes_before_a_statement():
    assert make_benchmark("math500").extract_answer("The answer is $4$. Check: \\boxed{5}") == "5"


def test_truncated_completion_needs_a_finished_statement():
    assert stated_answer("so the answer is 12", truncated=True) is None  # may be the 12 of 125
    assert stated_answer("so the answer is 12", truncated=False) == "12"
    assert stated_answer("so the answer is $12$", truncated=True) == "12"
