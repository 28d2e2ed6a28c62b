"""GSM8K and MATH-500: packaged and local loading, prompts, answers, errors, the registry."""

from __future__ import annotations

import json

import pytest

from rredcot_cli.benchmarks import BENCHMARKS, benchmark_names, make_benchmark
from rredcot_cli.benchmarks.base import Benchmark, Problem
from rredcot_cli.benchmarks.gsm8k import GSM8KBenchmark, last_number, parse_gold
from rredcot_cli.benchmarks.math500 import MATH500Benchmark
from rredcot_cli.errors import RredcotError

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# -- packaged data ----------------------------------------------------------------------------


def test_gsm8k_packaged_splits():
    bench = GSM8KBenchmark()
    assert isinstance(bench, Benchmark)
    test = bench.load("test")
    assert len(test) == 1319
    assert len(bench.load("train")) == 7473
    first = test[0]
    assert first.prompt_id == "gsm8k/test/0"
    assert first.gold_answer == "18"
    assert first.question.startswith("Janet")
    assert [p.prompt_id for p in bench.load("test", limit=3)] == ["gsm8k/test/0", "gsm8k/test/1", "gsm8k/test/2"]
    # thousands separators are stripped from the gold
    assert all("," not in p.gold_answer for p in test)


def test_math500_packaged_split():
    bench = MATH500Benchmark()
    assert isinstance(bench, Benchmark)
    problems = bench.load("test")
    assert len(problems) == 500
    assert len({p.prompt_id for p in problems}) == 500
    first = problems[0]
    assert first.prompt_id == "math500/test/test/precalculus/807.json"
    assert first.gold_answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.meta == {"subject": "Precalculus", "level": 2, "unique_id": "test/precalculus/807.json"}
    json.dumps([p.meta for p in problems])  # JSON-serialisable


def test_missing_packaged_split():
    with pytest.raises(RredcotError, match="no packaged split 'train'"):
        MATH500Benchmark().load("train")


@pytest.mark.parametrize("bench", [GSM8KBenchmark(), MATH500Benchmark()])
def test_prompt_has_boxed_instruction(bench):
    problem = bench.load("test", limit=1)[0]
    prompt = bench.prompt(problem)
    assert prompt == problem.question + "\n" + INSTRUCTION
    assert bench.PROMPT_TEMPLATE.format(question="Q?") == "Q?\n" + INSTRUCTION


def test_prompt_keeps_braces_in_question():
    bench = MATH500Benchmark()
    problem = Problem(prompt_id="x", question="Find $\\{x\\}$ in {a}.", gold_answer="1")
    assert bench.prompt(problem).startswith("Find $\\{x\\}$ in {a}.\n")


# -- answers and rewards ------------------------------------------------------------------------


def test_gsm8k_answers_and_verify():
    bench = GSM8KBenchmark()
    problem = bench.load("test", limit=1)[0]  # gold 18
    assert bench.extract_answer("... so \\boxed{18} dollars") == "18"
    assert bench.extract_answer("she makes 9 * 2 = 18 dollars.") == "18"
    assert bench.extract_answer("no numbers") is None
    assert bench.verify("9 * 2 = 18, so \\boxed{18}.", problem) == 1.0
    assert bench.verify("She makes $18 every day.", problem) == 1.0
    assert bench.verify("\\boxed{17}", problem) == 0.0
    assert bench.verify("", problem) == 0.0


def test_gsm8k_gold_parsing():
    assert parse_gold("5 + 5 = 10\n#### 1,000") == "1000"
    assert parse_gold("#### -3.5 ") == "-3.5"
    with pytest.raises(ValueError):
        parse_gold("no marker 5")
    assert last_number("made 70,000 dollars, not 5.") == "5"
    assert last_number("total 1,234.5") == "1234.5"


def test_math500_answers_and_verify():
    bench = MATH500Benchmark()
    problem = bench.load("test", limit=1)[0]
    assert bench.extract_answer("thus \\boxed{\\left(3,\\frac{\\pi}{2}\\right)}.") == "\\left(3,\\frac{\\pi}{2}\\right)"
    assert bench.extract_answer("no box") is None
    assert bench.verify("so $\\boxed{(3, \\pi/2)}$", problem) == 1.0
    assert bench.verify("so $\\boxed{(3, \\pi)}$", problem) == 0.0


def test_verify_timeout_is_unscorable():
    bench = GSM8KBenchmark(verify_timeout_s=0.5)
    problem = Problem(prompt_id="gsm8k/test/x", question="?", gold_answer="5")
    assert bench.verify("\\boxed{10^{10^{10}}}", problem) is None


# -- local files -----------------------------------------------------------------------------


def test_local_jsonl_file_and_folder(tmp_path):
    rows = [
        {"question": "1+1?", "answer": "1+1=2\n#### 2"},
        {"question": "Big?", "answer": "#### 1,234"},
    ]
    path = _write_jsonl(tmp_path / "mine.jsonl", rows)
    problems = GSM8KBenchmark(path=str(path)).load("test")
    assert [p.gold_answer for p in problems] == ["2", "1234"]
    assert [p.prompt_id for p in problems] == ["gsm8k/test/0", "gsm8k/test/1"]
    folder = tmp_path / "gsm"
    folder.mkdir()
    _write_jsonl(folder / "train.jsonl", rows[:1])
    assert len(GSM8KBenchmark(path=str(folder)).load("train")) == 1
    with pytest.raises(RredcotError, match="no test.jsonl"):
        GSM8KBenchmark(path=str(folder)).load("test")


def test_local_json_array(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([{"problem": "P", "answer": "3", "unique_id": "u1"}]), encoding="utf-8")
    (problem,) = MATH500Benchmark(path=str(path)).load("test")
    assert problem.prompt_id == "math500/test/u1"


def test_local_parquet_file_and_folder(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "problem": ["What is $1+1$?", "What is $\\frac{1}{2}+\\frac{1}{2}$?"],
            "solution": ["$\\boxed{2}$", "$\\boxed{1}$"],
            "answer": ["2", "1"],
            "subject": ["Algebra", "Algebra"],
            "level": [1, 2],
            "unique_id": ["a/1.json", "a/2.json"],
        }
    )
    path = tmp_path / "test.parquet"
    pq.write_table(table, path)
    for source in (path, tmp_path):
        problems = MATH500Benchmark(path=str(source)).load("test")
        assert [p.prompt_id for p in problems] == ["math500/test/a/1.json", "math500/test/a/2.json"]
        assert problems[1].meta == {"subject": "Algebra", "level": 2, "unique_id": "a/2.json"}
    assert len(MATH500Benchmark(path=str(path)).load("test", limit=1)) == 1


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        json.dumps({"question": "q", "answer": "#### 1"}) + "\n\n" + '{"question": "q", "answer": \n', encoding="utf-8"
    )
    with pytest.raises(RredcotError) as info:
        GSM8KBenchmark(path=str(path)).load("test")
    message = str(info.value)
    assert f"{path}:3" in message and "\n" not in message


def test_row_missing_fields_names_file_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "#### 1"}, {"question": "q"}])
    with pytest.raises(RredcotError, match=f"{path}:2"):
        GSM8KBenchmark(path=str(path)).load("test")
    path = _write_jsonl(tmp_path / "nomarker.jsonl", [{"question": "q", "answer": "the answer is 1"}])
    with pytest.raises(RredcotError, match=f"{path}:1: malformed GSM8K answer"):
        GSM8KBenchmark(path=str(path)).load("test")
    path = _write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "answer": "1"}, ["not", "an", "object"]])
    with pytest.raises(RredcotError, match=f"{path}:2: expected a JSON object"):
        MATH500Benchmark(path=str(path)).load("test")


def test_empty_split_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(RredcotError, match="has no rows"):
        MATH500Benchmark(path=str(path)).load("test")
    with pytest.raises(RredcotError, match="has no rows"):
        GSM8KBenchmark(path=str(path)).load("test")


def test_missing_local_path(tmp_path):
    with pytest.raises(RredcotError, match="does not exist"):
        GSM8KBenchmark(path=str(tmp_path / "nope.jsonl")).load("test")


# -- registry ----------------------------------------------------------------------------------


def test_registry_names_and_errors():
    assert benchmark_names() == ["arith", "chain", "chain_tail", "chain_verbose", "gsm8k", "jsonl", "math500", "search"]
    assert set(BENCHMARKS) == set(benchmark_names())
    with pytest.raises(ValueError, match="arith, chain, chain_tail, chain_verbose, gsm8k, jsonl, math500, search"):
        make_benchmark("mmlu")
    with pytest.raises(RredcotError, match="unknown benchmark 'mmlu'"):
        make_benchmark("mmlu")


def test_make_real_benchmarks(tmp_path):
    bench = make_benchmark("gsm8k", verify_timeout_s=2.5)
    assert isinstance(bench, GSM8KBenchmark) and bench.verify_timeout_s == 2.5 and bench.path is None
    path = _write_jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": "1"}])
    bench = make_benchmark("math500", path=str(path))
    assert isinstance(bench, MATH500Benchmark)
    assert bench.load("test")[0].prompt_id == "math500/test/0"


def test_make_synthetic_benchmarks():
    pytest.importorskip("rredcot_cli.benchmarks.synthetic")
    bench = make_benchmark("chain", min_steps=2, max_steps=3, data_seed=7)
    assert bench.name == "chain"
    assert make_benchmark("search").name == "search"
    with pytest.raises(ValueError, match="takes no path"):
        make_benchmark("chain", path="x.jsonl")


# -- hub ids (huggingface_hub mocked: no network here) -----------------------------------------------


def test_hub_id_without_datasets_downloads_the_split_file(tmp_path, monkeypatch):
    import sys

    hub = pytest.importorskip("huggingface_hub")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    local = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"question": ["1+1?"], "answer": ["#### 2"]}), local)
    math_local = _write_jsonl(tmp_path / "test.jsonl", [{"problem": "p", "answer": "1", "unique_id": "u"}])
    files = {
        "openai/gsm8k": ["README.md", "main/test-00000-of-00001.parquet", "main/train-00000-of-00001.parquet",
                         "socratic/test-00000-of-00001.parquet"],
        "HuggingFaceH4/MATH-500": ["README.md", "test.jsonl"],
    }
    downloaded = []

    def fake_download(repo_id, filename, repo_type=None, **kwargs):
        assert repo_type == "dataset"
        downloaded.append((repo_id, filename))
        return str(local if filename.endswith(".parquet") else math_local)

    monkeypatch.setattr(hub, "list_repo_files", lambda repo_id, repo_type=None, **kw: files[repo_id])
    monkeypatch.setattr(hub, "hf_hub_download", fake_download)
    (problem,) = GSM8KBenchmark(path="openai/gsm8k").load("test")
    assert problem.gold_answer == "2"
    assert downloaded[-1] == ("openai/gsm8k", "main/test-00000-of-00001.parquet")
    GSM8KBenchmark(path="openai/gsm8k:socratic").load("test")
    assert downloaded[-1] == ("openai/gsm8k", "socratic/test-00000-of-00001.parquet")
    (problem,) = MATH500Benchmark(path="HuggingFaceH4/MATH-500").load("test")
    assert problem.prompt_id == "math500/test/u"
    assert downloaded[-1] == ("HuggingFaceH4/MATH-500", "test.jsonl")
    with pytest.raises(RredcotError, match="no file for split 'validation'"):
        MATH500Benchmark(path="HuggingFaceH4/MATH-500").load("validation")


def test_unreachable_hub_id_is_a_one_line_error(monkeypatch):
    import sys

    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setitem(sys.modules, "datasets", None)

    def offline(*args, **kwargs):
        raise ConnectionError("no network\nat all")

    monkeypatch.setattr(hub, "list_repo_files", offline)
    with pytest.raises(RredcotError, match="not a local file or folder.*ConnectionError: no network at all"):
        GSM8KBenchmark(path="someone/typo").load("test")
