"""benchmark=arith_multiline: arith's questions with a few-shot multi-line answer (working line, the
graded Answer: line, a free Note: line); only the first Answer: line is graded, so the note cannot
change the outcome (issue 39 item 5, issue 37 item 4)."""

import pytest

from rredcot_cli.benchmarks.base import grade_completion
from rredcot_cli.config.compose import compose
from rredcot_cli.errors import ConfigError
from rredcot_cli.preflight import check
from rredcot_cli.stages.common import make_benchmark


def _benchmark_and_problem(gold: str = "12"):
    benchmark = make_benchmark(compose(["benchmark=arith_multiline", "model.chat_template=false"]))
    return benchmark, next(p for p in benchmark.load("test") if p.gold_answer == gold)


def test_the_answer_line_is_graded_not_the_last_number():
    benchmark, problem = _benchmark_and_problem("12")
    right = "Work: 5 + 7 = 12\nAnswer: 12\nNote: 12 is even, 13 is not."
    assert grade_completion(benchmark, right, problem, "stop") == ("12", 1.0)
    # The gold in the working line or the note does not rescue a wrong Answer: line.
    wrong = "Work: 5 + 7 = 12\nAnswer: 11\nNote: so 12."
    assert grade_completion(benchmark, wrong, problem, "stop") == ("11", 0.0)
    # A second Answer: line (the model running on into another turn) cannot change the first.
    assert grade_completion(benchmark, right + "\nAnswer: 3", problem, "stop") == ("12", 1.0)
    assert grade_completion(benchmark, "Work: 5 + 7 = 12\nThe answer is 12", problem, "stop") == (None, 0.0)


def test_a_truncated_answer_line_counts_only_when_the_newline_closed_it():
    benchmark, problem = _benchmark_and_problem("12")
    assert grade_completion(benchmark, "Work: 5 + 7 = 12\nAnswer: 1", problem, "length") == (None, 0.0)
    assert grade_completion(benchmark, "Work: 5 + 7 = 12\nAnswer: 1", problem, "stop") == ("1", 0.0)
    assert grade_completion(benchmark, "Work: 5 + 7 = 12\nAnswer: 12\nNote: it is", problem, "length") == ("12", 1.0)


def test_the_prompt_is_the_few_shot_chat_ending_in_the_question():
    benchmark, problem = _benchmark_and_problem("12")
    prompt = benchmark.prompt(problem)
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nWhat is 5 + 7? Answer with a single number.<|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert prompt.count("<|im_start|>assistant\nWork: ") == 3  # the three worked examples
    assert prompt.count("\nCheck: ") == 3 and prompt.count("\nAnswer: ") == 3 and prompt.count("\nNote: ") == 3
    assert benchmark.ANSWER_PROBE == "Answer: {answer}\n"  # answer_probe forces the format's own answer line


def test_the_chat_transcript_prompt_is_refused_under_a_second_chat_template():
    with pytest.raises(ConfigError, match=r"already a chat transcript \(<\|im_start\|>\); set model.chat_template=false"):
        check("sample", compose(["model=smollm2-135m-instruct", "benchmark=arith_multiline"]))
    check("sample", compose(["model=smollm2-135m-instruct", "model.chat_template=false", "benchmark=arith_multiline"]))
