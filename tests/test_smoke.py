"""End to end on the embedded tiny model: sample -> segment -> attribute -> train -> eval, each
stage as its own CLI process over one run directory, then a rerun of each stage alone."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = [
    "benchmark.min_steps=2", "benchmark.max_steps=4", "sampling.n=2", "sampling.max_new_tokens=48",
    "sample.num_prompts=3", "eval.num_problems=3", "eval.n=2", "eval.k=[1,2]",
    "train.steps=2", "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=1",
    "train.eval_problems=2", "train.eval_samples=2",
]


def rredcot(*args, cwd):
    # Works from a source checkout as well as from an installed package.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"rredcot {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def columns(path):
    return set(pq.read_schema(path).names)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    run = root / "runs" / "smoke"
    for stage in ["sample", "segment", "attribute"]:
        rredcot(stage, f"run.dir={run}", *SMALL, cwd=root)
    rredcot("attribute", f"run.dir={run}", "method=dr_grpo", *SMALL, cwd=root)
    rredcot("train", f"run.dir={run}", "method=grpo", *SMALL, cwd=root)
    rredcot("eval", f"run.dir={run}", f"model.path={run}/train/checkpoints/final", *SMALL, cwd=root)
    return run


def test_every_stage_writes_its_artifacts(run_dir):
    assert {"prompt_id", "sample_idx", "prompt", "completion", "completion_token_ids", "completion_logprobs",
            "reward", "gold_answer", "pred_answer", "benchmark", "finish_reason"} <= columns(run_dir / "sample/samples.parquet")
    samples = pq.read_table(run_dir / "sample/samples.parquet")
    assert samples.num_rows == 3 * 2
    assert {"prompt_id", "sample_idx", "segment_idx", "token_start", "token_end", "text", "strategy"} <= columns(
        run_dir / "segment/segments.parquet")
    for method in ["grpo", "dr_grpo"]:
        credits = pq.read_table(run_dir / f"attribute/{method}/credits.parquet")
        assert set(credits.column("method").to_pylist()) == {method}
        advantages = pq.read_table(run_dir / f"attribute/{method}/advantages.parquet").to_pylist()
        lengths = {(r["prompt_id"], r["sample_idx"]): len(r["completion_token_ids"]) for r in samples.to_pylist()}
        assert all(len(a["token_advantages"]) == lengths[(a["prompt_id"], a["sample_idx"])] for a in advantages)
    metrics = pq.read_table(run_dir / "train/metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1, 2]
    assert (run_dir / "train/checkpoints/final/model.safetensors").exists()
    assert {"prompt_id", "sample_idx", "correct"} <= columns(run_dir / "eval/eval.parquet")
    summary = json.loads((run_dir / "eval/metrics.json").read_text())
    assert 0.0 <= summary["pass@1"] <= 1.0 and "pass@2" in summary and "maj@2" in summary
    for stage in ["sample", "segment", "eval", "train"]:
        manifest = json.loads((run_dir / stage / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert (run_dir / stage / "config.yaml").exists()


def test_stage_reruns_alone_and_skips_when_up_to_date(run_dir):
    result = rredcot("segment", f"run.dir={run_dir}", *SMALL, cwd=run_dir.parent)
    assert "up to date" in result.stdout + result.stderr
    rredcot("segment", f"run.dir={run_dir}", "segment=fixed", "run.tag=fixed", *SMALL, cwd=run_dir.parent)
    segments = pq.read_table(run_dir / "segment-fixed/segments.parquet")
    assert set(segments.column("strategy").to_pylist()) == {"fixed"}


def test_changed_options_are_refused_not_mixed(run_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "segment", f"run.dir={run_dir}", "segment=fixed",
                             *SMALL], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 2
    assert "run.overwrite=true" in result.stderr and "Traceback" not in result.stderr


def test_sft_stage_trains_a_loadable_model(tmp_path):
    run = tmp_path / "runs" / "sft"
    rredcot("sft", f"run.dir={run}", "sft.steps=3", "sft.batch_size=4", "sft.warmup_steps=1", "sft.hidden_size=32",
            "sft.num_layers=1", "sft.num_heads=2", "sft.intermediate_size=64", cwd=tmp_path)
    model_dir = run / "sft" / "model"
    assert (model_dir / "model.safetensors").exists() and (model_dir / "tokenizer.json").exists()
    # The trained folder is a model path like any other.
    rredcot("eval", f"run.dir={run}", f"model.path={model_dir}", "eval.num_problems=2", "eval.n=2", "eval.k=[1,2]",
            "sampling.max_new_tokens=16", cwd=tmp_path)
    assert json.loads((run / "eval" / "metrics.json").read_text())["num_problems"] == 2


def test_sft_continues_from_a_shipped_model(tmp_path):
    """sft.init=tiny-chain starts from the shipped weights (a few small steps move them a little)."""
    from safetensors.torch import load_file

    from rredcot_cli.policy.models import EMBEDDED_DIR

    run = tmp_path / "runs" / "sft-init"
    rredcot("sft", f"run.dir={run}", "sft.init=tiny-chain", "sft.steps=2", "sft.batch_size=2", "sft.lr=1e-5",
            "sft.warmup_steps=1", "sft.min_steps=20", "sft.max_steps=24", cwd=tmp_path)
    before = load_file(EMBEDDED_DIR / "model.safetensors")
    after = load_file(run / "sft" / "model" / "model.safetensors")
    assert before.keys() == after.keys()
    gaps = [float((after[k] - before[k]).abs().max()) for k in before]
    assert 0 < max(gaps) < 1e-2


def test_sft_init_that_is_not_a_model_fails_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "sft", f"run.dir={tmp_path}/r",
                             f"sft.init={tmp_path}"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert "sft.init=" in result.stderr and "no model there" in result.stderr
    assert not (tmp_path / "r" / "sft").exists()
