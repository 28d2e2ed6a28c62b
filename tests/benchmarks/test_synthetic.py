"""The synthetic benchmarks: determinism, disjoint splits, gold solutions, the step checker."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot_cli.benchmarks.base import StepCheckedBenchmark
from rredcot_cli.benchmarks.synthetic import ChainBenchmark, ChainTailBenchmark, ChainVerboseBenchmark, SearchBenchmark

BENCHMARKS = [ChainBenchmark, ChainVerboseBenchmark, ChainTailBenchmark, SearchBenchmark]


@pytest.mark.parametrize("cls", BENCHMARKS)
def test_protocol_and_ids(cls):
    bench = cls()
    assert isinstance(bench, StepCheckedBenchmark)
    problems = bench.load("test", 5)
    assert [p.prompt_id for p in problems] == [f"{bench.name}/test/{i}" for i in range(5)]
    for p in problems:
        assert bench.min_steps <= p.meta["steps"] <= bench.max_steps
        json.dumps(p.meta)  # JSON-serialisable
        assert bench.prompt(p).endswith("\n")


@pytest.mark.parametrize("cls", BENCHMARKS)
def test_deterministic_and_prefix_stable(cls):
    a = cls(data_seed=7).load("train", 50)
    b = cls(data_seed=7).load("train", 80)
    assert a == b[:50]
    assert cls(data_seed=8).load("train", 50) != a


@pytest.mark.parametrize("cls", BENCHMARKS)
def test_splits_disjoint(cls):
    # Short chains make collisions likely if splits were independent streams only.
    bench = cls(min_steps=2, max_steps=3)
    questions = {s: {p.question for p in bench.load(s, 2000)} for s in ("train", "validation", "test")}
    assert not questions["train"] & questions["test"]
    assert not questions["train"] & questions["validation"]
    assert not questions["validation"] & questions["test"]


def test_unknown_split():
    with pytest.raises(ValueError):
        ChainBenchmark().load("dev", 1)


@pytest.mark.parametrize("cls", BENCHMARKS)
def test_gold_solution_verifies(cls):
    bench = cls(min_steps=1, max_steps=30)
    for p in bench.load("validation", 100):
        sol = bench.solution(p)
        assert bench.verify(sol, p) == 1.0
        assert bench.extract_answer(sol) == p.gold_answer
        assert bench.first_wrong_step(sol, p) is None
        assert len(bench.step_char_spans(sol)) == p.meta["steps"]
        # EOS-free continuation after the answer is ignored by the checker
        assert bench.first_wrong_step(sol + "\nx=1: 2 no", p) is None


def test_chain_example_and_checker():
    bench = ChainBenchmark()
    p = bench.load("test", 1)[0]
    lines = bench.solution(p).split("\n")
    assert lines[-1] == f"Answer: {p.gold_answer}"
    # line 0 reads "<start><op><b>=<c>"
    start, op0 = p.meta["start"], p.meta["ops"][0]
    assert lines[0].startswith(f"{start}{op0}=")

    def corrupt(k, new_line):
        out = list(lines)
        out[k] = new_line
        return "\n".join(out)

    # wrong arithmetic at step 2
    a, rest = lines[2][0], lines[2][1:]
    wrong_c = str((int(lines[2][-1]) + 1) % 10)
    assert bench.first_wrong_step(corrupt(2, lines[2][:-1] + wrong_c), p) == 2
    # wrong carry-in at step 1 (first operand is not the previous result)
    assert bench.first_wrong_step(corrupt(1, str((int(lines[1][0]) + 3) % 10) + lines[1][1:]), p) == 1
    # wrong operand copied from the prompt at step 3
    line3 = lines[3]
    assert bench.first_wrong_step(corrupt(3, line3[:2] + str((int(line3[2]) + 1) % 10) + line3[3:]), p) == 3
    # garbled line
    assert bench.first_wrong_step(corrupt(0, "7+=?"), p) == 0
    # a missing line shifts everything after it: the first wrong index is the missing one
    assert bench.first_wrong_step("\n".join(lines[:1] + lines[2:]), p) == 1
    # chain stops early: first missing index
    steps = p.meta["steps"]
    assert bench.first_wrong_step("\n".join(lines[:3]) + "\nAnswer: 3", p) == 3
    assert bench.first_wrong_step("", p) == 0
    # an extra step line after all gold lines
    assert bench.first_wrong_step("\n".join(lines[:-1] + ["1+1=2", lines[-1]]), p) == steps
    # surrounding whitespace and blank lines are tolerated
    assert bench.first_wrong_step("\n\n".join(" " + ln for ln in lines), p) is None


def test_chain_verbose_poses_the_chain_problems_with_verbose_lines():
    """Same questions, answers and splits as chain; each line spells the same decisions out."""
    short, verbose = ChainBenchmark(), ChainVerboseBenchmark()
    for split in ("train", "test"):
        a, b = short.load(split, 20), verbose.load(split, 20)
        assert [(p.question, p.gold_answer, p.meta) for p in a] == [(p.question, p.gold_answer, p.meta) for p in b]
        assert all(p.prompt_id.startswith(f"chain_verbose/{split}/") for p in b)
        # the prompt asks for the verbose format, so a model trained on both formats can tell them apart
        assert all(verbose.prompt(q) == short.prompt(q)[:-1] + ", step by step in words\n" for q in b)
    p = verbose.load("test", 1)[0]
    lines = verbose.gold_lines(p)
    start, ops = p.meta["start"], p.meta["ops"]
    first = short.gold_lines(p)[0]  # "<start><op><b>=<c>"
    assert lines[0] == f"Step 1: we have {start}, the operations left are {' '.join(ops)}, so mod 10 we get {first}."
    assert all(line.startswith(f"Step {k + 1}: ") for k, line in enumerate(lines))
    # each line carries the operations still to do: the line above's list minus its first entry
    left = [line.split("are ", 1)[1].split(",", 1)[0].split() for line in lines]
    assert left == [ops[k:] for k in range(len(ops))]
    # wrong result at step 2 (the final digit before the full stop)
    out = list(lines)
    out[2] = out[2][:-2] + str((int(out[2][-2]) + 1) % 10) + "."
    assert verbose.first_wrong_step("\n".join(out) + f"\nAnswer: {p.gold_answer}", p) == 2
    # a miscounted step number is a wrong line too, and so is a wrong list of operations left
    out = list(lines)
    out[1] = out[1].replace("Step 2:", "Step 3:")
    assert verbose.first_wrong_step("\n".join(out), p) == 1
    out = list(lines)
    out[3] = out[3].replace(f"are {ops[3]}", f"are {ops[2]}", 1)
    assert verbose.first_wrong_step("\n".join(out), p) == 3
    # tens of characters per step (character tokens): a 4-12 step chain is hundreds of tokens
    assert all(60 <= len(line) <= 70 + 3 * len(ops) for line in lines)


def test_verify_and_extract():
    bench = ChainBenchmark()
    p = bench.load("test", 1)[0]
    wrong = str((int(p.gold_answer) + 1) % 10)
    assert bench.verify(f"Answer: {p.gold_answer}", p) == 1.0
    assert bench.verify(f"1+1=2\nAnswer:  {p.gold_answer} \n", p) == 1.0
    assert bench.verify(f"Answer: {wrong}", p) == 0.0
    assert bench.verify("1+1=2\n", p) == 0.0
    assert bench.verify("", p) == 0.0
    assert bench.extract_answer("Answer:") is None
    assert bench.extract_answer("x\nAnswer: 4\nAnswer: 5") == "4"


def test_step_char_spans():
    bench = ChainBenchmark()
    text = "1+2=3\n\n3*4=2\nAnswer: 2\n5+5=0"
    spans = bench.step_char_spans(text)
    assert [text[s:e] for s, e in spans] == ["1+2=3", "3*4=2"]
    assert spans[0] == (0, 5)


def test_search_example_and_checker():
    bench = SearchBenchmark(min_steps=5, max_steps=5)
    p = bench.load("test", 1)[0]
    lines = bench.solution(p).split("\n")
    assert len(lines) == 6 and lines[-1] == f"Answer: {p.gold_answer}"
    assert all(ln.endswith(" no") for ln in lines[:4]) and lines[4].endswith(" yes")
    assert lines[4].startswith(f"x={p.gold_answer}: {p.meta['c']} ")
    # claiming success too early
    assert bench.first_wrong_step("\n".join([lines[0], lines[1][:-3] + " yes", f"Answer: 1"]), p) == 1
    assert bench.first_wrong_step("\n".join(lines[:3]), p) == 3


@pytest.mark.parametrize("cls", BENCHMARKS)
def test_trials_follow_steps(cls):
    for n in (1, 7, 20):
        for p in cls(min_steps=n, max_steps=n).load("test", 3):
            assert p.meta["steps"] == n
            assert len(cls().step_char_spans(cls().solution(p))) == n


def test_chain_length_range():
    """Prompt + completion in characters (= tokens of the char tokenizer): ~50 at 4 steps, 600+ at 100."""
    def mean_len(n):
        bench = ChainBenchmark(min_steps=n, max_steps=n)
        problems = bench.load("test", 20)
        return sum(len(bench.prompt(p)) + len(bench.solution(p)) for p in problems) / len(problems)

    assert 40 <= mean_len(4) <= 80
    assert mean_len(12) > mean_len(4)
    assert mean_len(100) >= 600
    assert len(ChainBenchmark(100, 100).solution(ChainBenchmark(100, 100).load("test", 1)[0])) >= 600


def _corrupt_line(line: str, salt: int) -> str:
    """A different line: change the last digit (the computed result) or append junk."""
    for i in range(len(line) - 1, -1, -1):
        if line[i].isdigit():
            return line[:i] + str((int(line[i]) + 1 + salt % 9) % 10) + line[i + 1:]
    return line + "?"


@settings(max_examples=60, deadline=None)
@given(
    cls=st.sampled_from(BENCHMARKS),
    index=st.integers(min_value=0, max_value=199),
    j_frac=st.floats(min_value=0, max_value=1, exclude_max=True),
    salt=st.integers(min_value=0, max_value=100),
    mode=st.sampled_from(["result", "garble", "drop", "truncate"]),
)
def test_corrupting_step_j_gives_first_wrong_step_j(cls, index, j_frac, salt, mode):
    bench = cls(min_steps=1, max_steps=40)
    p = bench.load("validation", 200)[index]
    steps = p.meta["steps"]
    j = int(j_frac * steps)
    lines = bench.solution(p).split("\n")  # steps lines + answer line
    if mode == "result":
        lines[j] = _corrupt_line(lines[j], salt)
    elif mode == "garble":
        lines[j] = "#" * (1 + salt % 5)
    elif mode == "drop":
        if j + 1 < steps and lines[j] == lines[j + 1]:
            return  # dropping one of two identical lines is not an error at j
        del lines[j]
    else:  # truncate: stop before step j and answer
        lines = lines[:j] + ["Answer: 0"]
    assert bench.first_wrong_step("\n".join(lines), p) == j


@pytest.mark.parametrize("cls", BENCHMARKS)
def test_noisy_solutions(cls):
    """SFT noise: a miscomputed step is where the checker says the chain first goes wrong."""
    import random

    bench = cls(min_steps=5, max_steps=15)
    problems = bench.load("train", 200)
    assert all(bench.solution(p, error_rate=0.0, rng=random.Random(0)) == bench.solution(p) for p in problems)
    rng_a, rng_b = random.Random(1), random.Random(1)
    noisy = [bench.solution(p, error_rate=0.2, rng=rng_a) for p in problems]
    assert noisy == [bench.solution(p, error_rate=0.2, rng=rng_b) for p in problems]
    wrong = 0
    for p, text in zip(problems, noisy):
        gold_lines = bench.gold_lines(p)
        lines = text.split("\n")
        lines = lines[:next(i for i, line in enumerate(lines) if line.startswith("Answer:"))]  # chain_tail: a tail follows
        assert len(lines) == p.meta["steps"]
        first = next((k for k, (a, b) in enumerate(zip(lines, gold_lines)) if a != b), None)
        assert bench.first_wrong_step(text, p) == first
        wrong += first is not None
        if cls in (ChainBenchmark, ChainTailBenchmark) and first is None:
            assert bench.verify(text, p) == 1.0
    assert 0.3 < wrong / len(problems) < 0.99
    with pytest.raises(ValueError):
        bench.solution(problems[0], error_rate=0.1)


def test_chain_tail_grades_the_answer_line_not_the_tail():
    """A correct chain whose free-text tail holds a wrong number (even as the last number, even
    the word Answer inside a note) is correct; a wrong Answer line with the gold number in the tail
    is wrong. The tail is never a step line."""
    from rredcot_cli.benchmarks.base import grade_completion

    bench = ChainTailBenchmark(min_steps=3, max_steps=3)
    problem = bench.load("test", 1)[0]
    gold = problem.gold_answer
    wrong = str((int(gold) + 1) % 10)
    steps = "\n".join(bench.gold_lines(problem))
    right = f"{steps}\nAnswer: {gold}\nNote: red {wrong} cat dog\nNote: the answer is {wrong}\n{wrong}"
    assert bench.verify(right, problem) == 1.0
    assert grade_completion(bench, right, problem) == (gold, 1.0)
    assert bench.first_wrong_step(right, problem) is None
    assert len(bench.step_char_spans(right)) == 3
    slipped = f"{steps}\nAnswer: {wrong}\nNote: red {gold} cat dog\nAnswer: {gold}"
    assert grade_completion(bench, slipped, problem) == (wrong, 0.0)


def test_chain_tail_is_deterministic_by_data_seed_with_its_tail():
    """Same data seed: the same problems and the same gold completions, tail included; another
    data seed: other problems. The problems are chain's own (same questions, same splits)."""
    a, b = ChainTailBenchmark(data_seed=7), ChainTailBenchmark(data_seed=7)
    problems = a.load("train", 20)
    assert problems == b.load("train", 20)
    assert [a.solution(p) for p in problems] == [b.solution(p) for p in b.load("train", 20)]
    assert ChainTailBenchmark(data_seed=8).load("train", 20) != problems
    assert [p.question for p in problems] == [p.question for p in ChainBenchmark(data_seed=7).load("train", 20)]
    assert all(a.prompt(p).endswith(", with notes\n") for p in problems)


@pytest.mark.parametrize("tail_lines", [0, 1, 4])
def test_chain_tail_solution_ends_with_its_tail(tail_lines):
    bench = ChainTailBenchmark(min_steps=2, max_steps=5, tail_lines=tail_lines)
    for p in bench.load("validation", 10):
        lines = bench.solution(p).split("\n")
        answer_at = next(i for i, line in enumerate(lines) if line.startswith("Answer:"))
        assert lines[:answer_at] == bench.gold_lines(p)
        tail = lines[answer_at + 1:]
        assert len(tail) == tail_lines and all(line.startswith("Note: ") for line in tail)


def test_chain_tail_rejects_a_negative_tail_in_one_line():
    with pytest.raises(ValueError, match="benchmark.options.tail_lines >= 0"):
        ChainTailBenchmark(tail_lines=-1)


def test_chain_tail_sft_targets_hold_the_tail_and_vary_it():
    """SFT targets (gold and noisy) contain the tail; noisy ones draw a fresh tail per example, so
    the fine-tuned model writes high-entropy text after the graded line."""
    import random

    from rredcot_cli.policy.models import build_char_tokenizer
    from rredcot_cli.train.sft import _encode_examples

    bench = ChainTailBenchmark(min_steps=2, max_steps=4, tail_lines=3)
    problems = bench.load("train", 30)
    tok = build_char_tokenizer()
    for error_rate in (0.0, 0.05):
        targets = [tok.decode(c, skip_special_tokens=True)
                   for _, c in _encode_examples(bench, problems, tok, error_rate=error_rate, seed=0)]
        tails = [t.split("\n")[-3:] for t in targets]
        assert all(line.startswith("Note: ") for tail in tails for line in tail)
        assert len({tuple(t) for t in tails}) == len(problems)
    assert bench.solution(problems[0], 0.05, random.Random(1)) != bench.solution(problems[0], 0.05, random.Random(2))


def test_chain_tail_answer_probe_scores_the_answer_line_as_the_format_writes_it():
    """chain_tail's forced answer is its Answer line as the gold text writes it: "Answer: 7" and the
    newline before the Notes, no end-of-text (the model writes Notes there); chain keeps its EOS."""
    from transformers import AutoTokenizer

    from rredcot_cli.policy.models import resolve_model_path
    from rredcot_cli.values.answer_probe import probe_tokens

    tok = AutoTokenizer.from_pretrained(resolve_model_path("tiny-chain-tail"))
    bench = ChainTailBenchmark(min_steps=2, max_steps=2, tail_lines=2)
    problem = bench.load("test", 1)[0]
    gold = bench.solution(problem)
    answer_line = gold.index("Answer:")
    context, scored = probe_tokens(tok, bench.ANSWER_PROBE, problem.gold_answer)
    assert tok.decode(list(context)) == "Answer: "
    assert tok.decode(list(scored)) == problem.gold_answer + "\n"
    assert tok.eos_token_id not in scored
    # the probe's text is the gold completion's own text from the Answer line up to the first Note
    probe_text = tok.decode(list(context + scored))
    assert gold[answer_line:].startswith(probe_text) and gold[answer_line + len(probe_text):].startswith("Note: ")
    _, chain_scored = probe_tokens(tok, ChainBenchmark.ANSWER_PROBE, problem.gold_answer)
    assert chain_scored[-1] == tok.eos_token_id and ChainBenchmark.ANSWER_PROBE == "Answer: {answer}{eos}"


@pytest.mark.parametrize("prefix, expected", [
    ("", None),
    ("7+3=0\n0*4=0\n", None),  # steps only
    ("7+3=0\nAnswer: 0", None),  # the Answer line is still open: "0" may become "07"
    ("7+3=0\nAnswer: 0\n", 1.0),  # complete: graded now, whatever follows
    ("7+3=0\nAnswer: 0\nNote: sun 3 cat dog\nAnswer: 5\n", 1.0),  # the first Answer line is graded
    ("7+3=0\nAnswer: 5\nNote: red", 0.0),
    ("7+3=0\n  Answer:  0 \nNote", 1.0),  # surrounding whitespace ignored, as the grader does
    ("7+3=0\nAnswer:\nAnswer: 0\n", 0.0),  # an empty first answer is graded wrong
])
@pytest.mark.parametrize("cls", BENCHMARKS)
def test_decided_outcome_is_the_grade_once_the_first_answer_line_is_complete(cls, prefix, expected):
    assert cls().decided_outcome(prefix, "0") == expected


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(0, 200), tail=st.text(alphabet="Answer: 0123456789\nNote", max_size=30))
def test_a_decided_prefix_gets_the_grade_of_every_completion_that_extends_it(cut, tail):
    """The rule's whole claim: where decided_outcome is not None, verify of any continuation
    agrees with it."""
    bench = ChainTailBenchmark(min_steps=3, max_steps=3)
    problem = bench.load("test", 1)[0]
    text = bench.solution(problem)
    prefix = text[:cut]
    decided = bench.decided_outcome(prefix, problem.gold_answer)
    if decided is not None:
        assert bench.verify(prefix + tail, problem) == decided


def test_benchmarks_without_final_answers_declare_no_decided_outcome():
    """Last-number grading (arith, GSM8K) and boxed answers can be replaced by later text."""
    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.benchmarks.base import decided_outcome

    for name in ("arith", "gsm8k", "math500"):
        assert decided_outcome(make_benchmark(name), "The answer is 4.\n#### 4\n", "4") is None
