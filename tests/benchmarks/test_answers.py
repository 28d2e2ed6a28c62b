"""One extraction per completion (issue 27, item 4): the answer that earns the reward is the answer
recorded as ``pred_answer`` and voted on by maj@k, on every real benchmark; a completion cut off
at the token budget is scored only from an explicit final-answer marker; eval rows record the
finish reason, and eval files written before that column stay readable."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rredcot_cli.store import artifacts
from rredcot_cli.policy.base import Completion
from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.metrics import maj_at_k
from rredcot_cli.policy.models import build_char_tokenizer
from rredcot_cli.policy.load import Policy
from rredcot_cli.pipeline import evaluate, sample_rows

REPO = Path(__file__).resolve().parents[2]
GOLD = "12"

# Completions a small instruct model writes (SmolLM2-135M-Instruct on GSM8K), where the number
# math-verify would pick from the whole text is not the one the benchmark extracts.
ADVERSARIAL = [
    "She has 12 apples.\nChecking the answer:\n12 - 5 = 6",  # the issue's: last number 6
    "The answer is 12.\nChecking: 12 - 5 = 7",
    "The answer: 12",  # an answer phrase, no \boxed{} and no final-answer marker
    "So $x = 12$, then $\\frac{24}{2} = 12$ and 3 more",
    "\\boxed{12} is wrong; the answer is 6",
    "The final answer is 12. Check: 12 - 5 = 7",
    "#### 12\nthat is 2 dozen",
    "12 eggs, minus 6, gives \\boxed{}",
    "",
]


class _FixedBackend:
    """Returns the given (text, finish_reason) completions for every prompt."""

    def __init__(self, completions):
        self.completions = completions

    def generate(self, prompts, params, seed):
        return [[Completion(token_ids=[3] * max(1, len(t) // 4), logprobs=[-1.0] * max(1, len(t) // 4), text=t,
                            finish_reason=reason) for t, reason in self.completions] for _ in prompts]


def _policy(completions):
    return Policy(model=None, tokenizer=build_char_tokenizer(), backend=_FixedBackend(completions), device="cpu",
                  chat_template=False)


def _sample(bench, completions, gold=GOLD):
    problem = Problem(prompt_id=f"{bench.name}/test/0", question="How many?", gold_answer=gold)
    return sample_rows(_policy(completions), bench, [problem], n=len(completions), max_new_tokens=64,
                       temperature=1.0, top_p=1.0, seed=0, prompts_per_call=1), problem


def _jsonl(extractor, verifier="math_verify", **kw):
    return make_benchmark("jsonl", extractor=extractor, verifier=verifier, **kw)


# Each benchmark with the completion that states an answer in its own format, unambiguously.
BENCHMARKS = {
    "gsm8k": (lambda: make_benchmark("gsm8k"), lambda a: "\\boxed{" + a + "}"),
    "math500": (lambda: make_benchmark("math500"), lambda a: "\\boxed{" + a + "}"),
    "jsonl-boxed": (lambda: _jsonl("boxed"), lambda a: "\\boxed{" + a + "}"),
    "jsonl-last_number": (lambda: _jsonl("last_number"), lambda a: a),
    "jsonl-last_number-numeric": (lambda: _jsonl("last_number", "numeric"), lambda a: a),
    "jsonl-regex": (lambda: _jsonl("regex", answer_regex=r"answer:?\s*(\S+)"), lambda a: "answer: " + a),
    "jsonl-none": (lambda: _jsonl("none", "exact"), lambda a: a),
}


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_reward_is_the_verdict_on_the_recorded_answer(name):
    """reward == verify(pred_answer) for every completion, finished or truncated; so maj@k, which
    votes on pred_answer, counts the winner correct exactly when its answer earns the reward."""
    make, stated = BENCHMARKS[name]
    bench = make()
    completions = [(t, reason) for t in ADVERSARIAL for reason in ("stop", "length")]
    rows, problem = _sample(bench, completions)
    for row in rows:
        pred = row["pred_answer"]
        expected = 0.0 if pred is None else bench.verify(stated(pred), problem)
        assert row["scorable"] and expected is not None
        assert row["reward"] == expected, (row["completion"], row["finish_reason"], pred)
    for row in rows:  # maj@1 over one sample is that sample's verdict
        assert maj_at_k([row["pred_answer"]], [row["reward"] == 1.0], 1) == (row["reward"] == 1.0)


def test_gsm8k_issue_completion_is_graded_by_its_last_number():
    rows, _ = _sample(make_benchmark("gsm8k"), [(ADVERSARIAL[0], "stop")])
    assert (rows[0]["pred_answer"], rows[0]["reward"]) == ("6", 0.0)


def test_gsm8k_explicit_markers_come_before_the_last_number():
    bench = make_benchmark("gsm8k")
    assert bench.extract_answer("The final answer is 12. Check: 12 - 5 = 7") == "12"
    assert bench.extract_answer("Final Answer: **1,234**\n(that is 1 more than 1,233)") == "1234"
    assert bench.extract_answer("#### $18\nsee 2 above") == "18"
    assert bench.extract_answer("#### 5\n\\boxed{6}") == "6"  # \boxed{} first
    assert bench.extract_answer("The final answer is twelve, 3 short") == "3"  # no number: last number


def test_math500_without_boxed_reads_only_a_stated_answer():
    """No box: "the answer is 12" is read (verify.py's decision 3); a bare last number is not."""
    completions = [("the answer is 12", "stop"), ("so 5 + 7 = 12", "stop"), ("so \\boxed{12}", "stop")]
    rows, _ = _sample(make_benchmark("math500"), completions)
    assert [(r["pred_answer"], r["reward"]) for r in rows] == [("12", 1.0), (None, 0.0), ("12", 1.0)]


# -- truncated completions ------------------------------------------------------------------------

# GSM8K test/0 (gold 18) written out, cut off mid-reasoning right after the gold as an intermediate.
MID_REASONING = "Janet's ducks lay 16 eggs. She eats 3 and bakes 4, so 16 - 3 - 4 = 9 are sold. 9 * 2 = 18, and then"
MARKED = "9 * 2 = 18. The final answer is 18. Let me check: 16 - 3 = 13, 13 - 4 ="


@pytest.mark.parametrize("make", [lambda **kw: make_benchmark("gsm8k", **kw),
                                  lambda **kw: _jsonl("last_number", **kw)], ids=["gsm8k", "jsonl-last_number"])
def test_truncated_completion_scores_only_from_a_final_answer_marker(make):
    completions = [(MID_REASONING, "length"), (MID_REASONING + " 18", "stop"), (MARKED, "length"),
                   ("she sells 9 eggs: \\boxed{18}, and", "length")]
    rows, _ = _sample(make(), completions, gold="18")
    assert [(r["pred_answer"], r["reward"]) for r in rows] == [(None, 0.0), ("18", 1.0), ("18", 1.0), ("18", 1.0)]
    old, _ = _sample(make(truncated_last_number=True), completions[:1], gold="18")
    assert (old[0]["pred_answer"], old[0]["reward"]) == ("18", 1.0)


def test_training_reward_and_eval_metric_apply_the_same_truncation_rule():
    bench = make_benchmark("gsm8k")
    completions = [(MID_REASONING, "length"), (MID_REASONING + " 18", "stop"), (MARKED, "length")]
    problem = Problem(prompt_id="gsm8k/test/0", question="Janet?", gold_answer="18")
    samples = sample_rows(_policy(completions), bench, [problem], n=3, max_new_tokens=64, temperature=1.0,
                          top_p=1.0, seed=0, prompts_per_call=1)
    rows, summary = evaluate(_policy(completions), bench, [problem], n=3, ks=[1, 3], max_new_tokens=64,
                             temperature=1.0, top_p=1.0, seed=0, prompts_per_call=1, model_name="fixed")
    assert [r["correct"] for r in rows] == [s["reward"] == 1.0 for s in samples] == [False, True, True]
    assert [r["pred_answer"] for r in rows] == [s["pred_answer"] for s in samples] == [None, "18", "18"]
    assert summary["pass@1"] == pytest.approx(2 / 3) and summary["maj@3"] == 1.0


def test_truncated_last_number_is_a_benchmark_setting():
    from rredcot_cli.config.compose import compose
    from rredcot_cli.stages.common import make_benchmark as from_config

    assert from_config(compose(["benchmark=gsm8k"])).truncated_last_number is False
    assert from_config(compose(["benchmark=gsm8k", "benchmark.truncated_last_number=true"])).truncated_last_number
    assert from_config(compose(["benchmark=math500", "benchmark.truncated_last_number=true"])).name == "math500"


# -- finish_reason in eval.parquet ----------------------------------------------------------------


def test_eval_rows_record_the_finish_reason(tmp_path):
    completions = [("so \\boxed{12}", "stop"), ("12 - 5 = 7 and", "length")]
    problem = Problem(prompt_id="gsm8k/test/0", question="How many?", gold_answer=GOLD)
    rows, _ = evaluate(_policy(completions), make_benchmark("gsm8k"), [problem], n=2, ks=[1], max_new_tokens=64,
                       temperature=1.0, top_p=1.0, seed=0, prompts_per_call=1, model_name="fixed")
    assert [r["finish_reason"] for r in rows] == ["stop", "length"]
    path = artifacts.write_artifact("eval", rows, tmp_path / "eval.parquet")
    assert artifacts.read_artifact("eval", path).column("finish_reason").to_pylist() == ["stop", "length"]


def test_eval_files_without_finish_reason_stay_readable(tmp_path):
    rows = [dict(prompt_id="p", sample_idx=0, completion="x", num_tokens=1, pred_answer="7", gold_answer="7",
                 correct=True, scorable=True, steps=4, benchmark="chain", model="tiny")]
    old = artifacts.build_table("eval", rows).drop_columns(["finish_reason"])
    pq.write_table(old, tmp_path / "eval.parquet")
    table = artifacts.read_artifact("eval", tmp_path / "eval.parquet")
    assert table.column("finish_reason").to_pylist() == [None]
    committed = sorted((REPO / "results").rglob("eval.parquet"))
    assert committed, "results/ holds committed runs"
    for path in committed[:5]:
        assert "finish_reason" in artifacts.read_artifact("eval", path).schema.names
