"""benchmark=arith_multiline: arith's questions with a few-shot multi-line answer (working line, the
graded Answer: line, a free Note: line); only the first Answer: line is graded, so the note cannot
change the outcome (issue 39 item 5, issue 37 item 4)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize("prefix, expected", [
    ("", None),
    ("Work: 5 + 7 = 12\nCheck: 7 + 5 = 12\n", None),  # no Answer: line yet
    ("Work: 5 + 7 = 12\nAnswer: 1", None),  # still open: "1" may become "12"
    ("Work: 5 + 7 = 12\nAnswer: 12\n", 1.0),  # closed: graded now, whatever follows
    ("Work: 5 + 7 = 12\nAnswer: 11\nNote: so 12", 0.0),
    ("Work: 5 + 7 = 12\nAnswer: 12\nNote: x\nAnswer: 3\n", 1.0),  # the first Answer: line is graded
    ("Work: 5 + 7 = 12\nAnswer: twelve\n", 0.0),  # a closed line without a number is graded wrong
])
def test_a_closed_answer_line_decides_the_outcome(prefix, expected):
    """RREDCoT's decided-prefix rule (methods/rredcot.py) reads this: the note after the graded
    line cannot change the reward, so its value is the verdict, not an estimate."""
    from rredcot_cli.benchmarks.base import decided_outcome

    benchmark, _ = _benchmark_and_problem("12")
    assert decided_outcome(benchmark, prefix, "12") == expected


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 60), tail=st.text(alphabet="Answer: 0123456789\nNote", max_size=30),
       finish=st.sampled_from(["stop", "length"]))
def test_a_decided_prefix_gets_the_grade_of_every_completion_that_extends_it(cut, tail, finish):
    """Wherever decided_outcome speaks, grading any continuation, cut off or not, agrees with it."""
    from rredcot_cli.benchmarks.base import decided_outcome

    benchmark, problem = _benchmark_and_problem("12")
    text = "Work: 5 + 7 = 12\nCheck: 7 + 5 = 12\nAnswer: 12\nNote: 12 is even.\n"
    decided = decided_outcome(benchmark, text[:cut], problem.gold_answer)
    if decided is not None:
        assert grade_completion(benchmark, text[:cut] + tail, problem, finish)[1] == decided


def test_other_extractors_decide_nothing_early():
    """Last-number, boxed, regex and whole-text grading read the end of the completion."""
    from rredcot_cli.benchmarks.base import decided_outcome

    for extractor in ("boxed", "last_number", "none"):
        benchmark = make_benchmark(compose(["benchmark=arith_multiline", "model.chat_template=false",
                                            f"benchmark.extractor={extractor}"]))
        assert decided_outcome(benchmark, "Work: 5 + 7 = 12\nAnswer: 12\n", "12") is None


def test_credit_batch_values_each_prefix_after_the_closed_answer_line_at_its_grade():
    """What RREDCoT receives on this task: the verdict at every boundary from the closed Answer:
    line on, graded from the text (the second trace's reward is flipped to show it is not read)."""
    from rredcot_cli.pipeline import credit_batch

    benchmark, problem = _benchmark_and_problem("12")
    texts = ["Work: 5 + 7 = 12\nAnswer: 12\nNote: 12 is even.", "Work: 5 + 7 = 11\nAnswer: 11\nNote: odd\nNote: x"]
    samples, segments = [], []
    for i, text in enumerate(texts):
        ids = [ord(c) for c in text]  # one token per character
        samples.append({"prompt_id": problem.prompt_id, "sample_idx": i, "prompt_token_ids": [1],
                        "completion_token_ids": ids, "completion_logprobs": [0.0] * len(ids), "reward": float(i),
                        "gold_answer": "12", "pred_answer": None, "benchmark": benchmark.name})
        start = 0
        for k, line in enumerate(text.splitlines(keepends=True)):
            segments.append({"prompt_id": problem.prompt_id, "sample_idx": i, "segment_idx": k,
                             "token_start": start, "token_end": start + len(line), "text": line})
            start += len(line)
    decided = credit_batch(samples, segments, benchmark=benchmark).extras["decided_values"]
    nan = float("nan")
    expected = torch.tensor([[nan, 1.0, 1.0, nan], [nan, 0.0, 0.0, 0.0]])
    assert torch.equal(decided.isnan(), expected.isnan())
    assert torch.equal(decided.nan_to_num(-1), expected.nan_to_num(-1))
