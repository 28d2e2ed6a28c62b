"""benchmark=arith: the packaged files are what scripts/make_arith.py writes, the splits share no
question, and an answer is graded as a number from the last one written."""

import json
from pathlib import Path

from repo_scripts import load_script
from rredcot_cli.benchmarks.base import grade_completion
from rredcot_cli.config.compose import compose
from rredcot_cli.stages.common import make_benchmark

REPO = Path(__file__).resolve().parents[2]


def _generator():
    return load_script("scripts/make_arith.py")


def test_packaged_files_are_the_generators_output(tmp_path, monkeypatch):
    make_arith = _generator()
    monkeypatch.setattr(make_arith, "OUT", tmp_path)
    make_arith.main()
    for split in ("train", "test"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (REPO / "rredcot_cli/data/arith" / f"{split}.jsonl").read_text()


def test_splits_are_disjoint_and_cover_every_question():
    benchmark = make_benchmark(compose(["benchmark=arith"]))
    train, test = benchmark.load("train"), benchmark.load("test")
    assert (len(train), len(test)) == (116, 39)
    assert not {p.question for p in train} & {p.question for p in test}
    for problem in train + test:
        a, op, b = problem.question.split("?")[0].removeprefix("What is ").split()
        assert int(problem.gold_answer) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0


def test_grading():
    benchmark = make_benchmark(compose(["benchmark=arith"]))
    problem = next(p for p in benchmark.load("test") if p.gold_answer == "12")
    assert benchmark.prompt(problem) == problem.question  # the question is the whole prompt
    assert grade_completion(benchmark, "12", problem, "stop") == ("12", 1.0)
    assert grade_completion(benchmark, "5 + 7 = 12.", problem, "stop") == ("12", 1.0)
    assert grade_completion(benchmark, "The answer is 13", problem, "stop") == ("13", 0.0)
    # Cut off at the budget without "The final answer is": no answer, whatever number came last.
    assert grade_completion(benchmark, "Let me think: 5 + 7 = 12 and", problem, "length") == (None, 0.0)
    assert benchmark.ANSWER_PROBE == "\nThe final answer is {answer}"
    json.dumps(benchmark.load("train", limit=1)[0].meta)
