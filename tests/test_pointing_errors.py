"""Errors that name the actual fix: a training run read without train.step, a stage run without
run.dir, a hub id with no way to download it, a GGUF file cut short, a token budget past the
model's context. Each is one `error:` line with exit status 2, and no folder is left behind."""

import os
import time

import huggingface_hub
from test_bad_input import one_error_line, rredcot  # the CLI in this process; its one error line

from rredcot_cli.store import train_rollouts


def _saved_step(train_dir, step, method):
    """The files ``rredcot train train.save_rollouts=N`` leaves for a step (their presence is what is read)."""
    folder = train_rollouts.step_dir(train_dir, step)
    for inside in ["sample/samples.parquet", "segment/segments.parquet", f"attribute/{method}/credits.parquet",
                   f"attribute/{method}/advantages.parquet"]:
        (folder / inside).parent.mkdir(parents=True, exist_ok=True)
        (folder / inside).write_bytes(b"")


def test_heatmap_on_a_training_run_names_train_step_and_the_saved_steps(tmp_path):
    run = tmp_path / "trained"
    for step in (5, 10):
        _saved_step(run / "train", step, "rredcot")
    code, stderr = rredcot("heatmap", f"run.dir={run}", "method=rredcot")
    line = one_error_line(stderr)
    assert code == 2 and "a training run: pass train.step=N" in line and "heatmap: 5, 10)" in line, line
    assert "rredcot sample" in line.split("train.step=N")[1]  # the old advice comes second
    # Saved steps credited by another method: the attribute command that credits one of them.
    code, stderr = rredcot("heatmap", f"run.dir={run}", "method=grpo")
    line = one_error_line(stderr)
    assert code == 2 and f"`rredcot attribute run.dir={run} train.step=10 method=grpo`" in line, line
    assert not (run / "heatmap").exists()


def test_segment_without_run_dir_says_run_dir_is_needed_and_where_samples_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "demo" / "sample").mkdir(parents=True)
    (tmp_path / "runs" / "demo" / "sample" / "samples.parquet").write_bytes(b"")
    code, stderr = rredcot("segment")
    line = one_error_line(stderr)
    assert code == 2 and line.startswith("error: rredcot segment needs run.dir"), line
    assert "(runs/demo holds one)" in line and "inputs.samples=PATH" in line and "runs/2" not in line
    assert os.listdir(tmp_path / "runs") == ["demo"]


def test_a_hub_id_in_offline_mode_fails_at_once_with_the_offline_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, stderr = rredcot("sample", f"run.dir={tmp_path / 'r'}", "model.path=nobody-here/no-such-model")
    line = one_error_line(stderr)
    assert code == 2 and "not in the local cache" in line and "offline mode (HF_HUB_OFFLINE)" in line, line
    assert "a local model folder or GGUF file" in line and "HF_HUB_OFFLINE=1" in line
    assert not (tmp_path / "r").exists()


def test_a_hub_id_with_the_hub_unreachable_fails_at_once(tmp_path, monkeypatch):
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    started = time.perf_counter()
    code, stderr = rredcot("sample", f"run.dir={tmp_path / 'r'}", "model.path=nobody-here/no-such-model")
    line = one_error_line(stderr)
    assert time.perf_counter() - started < 15, "retried instead of failing at once"
    assert code == 2 and "http://127.0.0.1:9 cannot be reached" in line and "HF_HUB_OFFLINE=1" in line, line
    assert not (tmp_path / "r").exists()


def test_a_gguf_file_cut_short_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RREDCOT_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little"))
    code, stderr = rredcot("sample", f"run.dir={tmp_path / 'r'}", f"model.path={gguf}")
    line = one_error_line(stderr)
    assert code == 2 and line.startswith(f"error: model.path={gguf}: transformers cannot read this GGUF file"), line
    assert "download it again, or pass another GGUF file or a HF model folder" in line
    assert not (tmp_path / "r").exists()


def test_a_token_budget_past_the_models_context_names_both_numbers(tmp_path):
    code, stderr = rredcot("sample", f"run.dir={tmp_path / 'r'}", "sampling.max_new_tokens=100000",
                           "sample.num_prompts=1", "sampling.n=1")
    line = one_error_line(stderr)
    assert code == 2 and line.startswith("error: sampling.max_new_tokens=100000: a prompt of "), line
    assert "past the model's context of 2048 tokens (max_position_embeddings)" in line
    assert "set sampling.max_new_tokens <= " in line
    assert not (tmp_path / "r").exists()
