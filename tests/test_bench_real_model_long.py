"""bench/real_model.py --shape long (issue 42 item 3): the value pass's forward bound on a hand-made
rollout, the goals and the generated table on hand-made figures, and the whole shape on the
embedded model (--smoke)."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from repo_scripts import REPO, load_script

real_model = load_script("bench/real_model.py")


def _write_rollout(step_dir: Path, tokenizer) -> None:
    """One group of three completions of the chain task: 3, 2 and 1 segments; the first two share
    their first segment's tokens (so their probes after it are the same probes); rewards 1, 0, 1
    with answers "7" (the gold), "3" and "07" (another correct surface form)."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = ids("1+2=?")
    completions = [ids("1+2=3\n3+4=7\n"), ids("1+2=3\n3+0="), ids("3+4=7\n")]
    assert [len(prompt), *map(len, completions)] == [5, 12, 10, 6]  # one token per character
    cuts = [[0, 4, 8, 12], [0, 4, 10], [0, 6]]
    preds, rewards = ["7", "3", "07"], [1.0, 0.0, 1.0]
    samples = [{"prompt_id": "chain/test/0", "sample_idx": i, "benchmark": "chain", "reward": rewards[i],
                "prompt_token_ids": prompt, "completion_token_ids": c, "completion_logprobs": [-1.0] * len(c),
                "gold_answer": "7", "pred_answer": preds[i], "finish_reason": "stop"} for i, c in enumerate(completions)]
    segments = [{"prompt_id": "chain/test/0", "sample_idx": i, "segment_idx": k, "token_start": a, "token_end": b,
                 "text": tokenizer.decode(completions[i][a:b])}
                for i, cut in enumerate(cuts) for k, (a, b) in enumerate(zip(cut, cut[1:]))]
    (step_dir / "sample").mkdir(parents=True)
    (step_dir / "segment").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(samples), step_dir / "sample" / "samples.parquet")
    pq.write_table(pa.Table.from_pylist(segments), step_dir / "segment" / "segments.parquet")


def test_value_pass_bound_counts_the_probes_of_a_hand_made_rollout(tmp_path):
    from transformers import AutoTokenizer

    from rredcot_cli.policy.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("embedded"))
    _write_rollout(tmp_path, tokenizer)
    shapes = {"non_embedding_params": 1000, "hidden": 10, "vocab": 50}
    work = real_model.value_pass_work(tmp_path, "embedded", shapes)
    # Inner boundaries (baseline group_mean): completion 0 after tokens 4 and 8, completion 1 after
    # 4, completion 2 none. Candidates: the gold "7" for all; "07" (completion 2's, correct) for
    # completions 0 and 1; "3" is wrong and "7" of completion 0 is the gold already. 2 x 2 + 1 x 2
    # probes; completion 1's two after token 4 repeat completion 0's (same prefix tokens).
    assert (work["boundaries"], work["probes"], work["distinct_probes"]) == (3, 6, 4)
    # traces up to their last probed prefix: 5 + 8 and 5 + 4
    assert work["trace_positions"] == 13 + 9
    # "Answer: " (8) + "7" + EOS, and "Answer: " + "07" + EOS, at two prefixes
    assert (work["probe_positions"], work["scored_positions"]) == (2 * (10 + 11), 2 * (2 + 3))
    assert work["flops_bound_body"] == 2 * 1000 * (22 + 42)
    assert work["flops_bound_head"] == 2 * 10 * 50 * 10
    step = {"value_pass": work, "phases": {"credit": 3.0}, "credit_forward_tokens": 100}
    bound = real_model.value_pass_bound(step, {"body_gflops": 128e-9, "head_gflops": 10e-9})
    assert bound["bound_s"] == pytest.approx(2 * 1000 * 64 / 128 + 2 * 10 * 50 * 10 / 10)
    assert bound["credit_over_bound"] == pytest.approx(3.0 / bound["bound_s"])


def _run(label: str, seconds: float, phases: dict, **extra) -> dict:
    step = {"step": 1, "seconds": seconds, "tokens": 2000, "signal": True,
            "phases": {p: phases.get(p, 0.0) for p in ("sampling", "segment", "credit", "old_logprobs", "update")},
            "update_bound_s": 10.0, "update_over_bound": phases.get("update", 0.0) / 10.0, "positions_real": 2100,
            "positions_padded": 2400, "flops_bound_body": 1e12, "flops_bound_head": 1e11, "flops_executed": 1.5e12,
            "old_pass": False, "completion_tokens": 2000, "mean_completion_tokens": 125.0, "truncated": 1, **extra}
    return {"run": label, "returncode": 0, "seed": 0, "backend": "vllm" if "vllm" in label else "hf",
            "steps": [step], "mean": {"s_per_step": seconds, "sampling_tokens_per_s": 2000 / phases["sampling"],
                                      "update_steps_with_passes": [1], "update_over_bound": phases["update"] / 10.0},
            "peak_rss_bytes": 3 * 2**30, "peak_rss_over_floor": 1.5, "cpu_share": 0.9, "others_cores_mean": 0.5,
            "others_cores_max": 0.7, "command": "python -m rredcot_cli train ...",
            "groups": {"rewards": {"a": [1.0, 0.0]}, "mixed_groups": ["a"], "completions_sha256": "x"}}


def test_long_goals_and_table_from_hand_made_figures(tmp_path):
    value = {"boundaries": 10, "probes": 20, "distinct_probes": 18, "trace_positions": 1000, "probe_positions": 200,
             "scored_positions": 40, "flops_bound_body": 100e9, "flops_bound_head": 0}
    data = {"date": "d", "commit": "c", "total_wall_s": 60.0, "seed": 0, "seeds_tried": [0], "smoke": False,
            "model": "m", "root": "/r", "machine": {"cpu_model": "cpu", "torch": "t"},
            "shapes": {"floor_bytes": 2**31}, "long_shape": {"prompts": 2, "samples": 8, "max_new_tokens": 1024,
                                                             "split": "test"},
            "matmul": {"body_gflops": 100.0, "head_gflops": 50.0, "others_cores_mean": 0.5},
            "training": [_run("grpo-hf-seed0", 100.0, {"sampling": 50.0, "update": 40.0}),
                         _run("rredcot-hf-seed0", 130.0, {"sampling": 50.0, "credit": 2.5, "update": 40.0},
                              value_pass=value, credit_forward_tokens=1500),
                         _run("rredcot-vllm-seed0", 110.0, {"sampling": 20.0, "credit": 2.5, "update": 40.0,
                                                            "old_logprobs": 10.0}, old_pass=True)],
            "decode": [{"backend": "vllm", "tokens_per_s": 80.0, "tokens_per_cpu_s": 80.0, "others_cores_mean": 0.5,
                        "tokens": 2000, "completions": 16, "n": 8, "mean_tokens": 125.0, "max_tokens": 1024,
                        "wall_s": 25.0, "peak_rss_bytes": 2**31, "command": "python bench/throughput.py ..."}]}
    goals = real_model.long_goals(data)
    assert goals["rredcot_over_grpo_step/rredcot-hf"]["ratio"] == pytest.approx(1.3)
    assert not goals["rredcot_over_grpo_step/rredcot-hf"]["met"]
    # vLLM samples other completions than GRPO's HF run: no measured ratio there, the estimate only
    assert "rredcot_over_grpo_step/rredcot-vllm" not in goals
    assert goals["rredcot_over_grpo_step_est/rredcot-vllm"]["ratio"] == pytest.approx(110.0 / 107.5)
    assert goals["rredcot_over_grpo_step_est/rredcot-hf"]["ratio"] == pytest.approx(130.0 / 127.5)
    assert goals["vllm_over_train_sampling/grpo-hf"]["ratio"] == pytest.approx(80.0 / 40.0)  # 2000 tok in 50 s
    assert goals["vllm_over_train_sampling/rredcot-vllm"]["ratio"] == pytest.approx(0.8)
    assert goals["update_over_bound/grpo-hf"]["ratio"] == pytest.approx(4.0)
    # the bound counts the old-log-prob pass where it ran, so its seconds count too: (40 + 10) / 10
    assert goals["update_over_bound/rredcot-vllm"]["ratio"] == pytest.approx(5.0)
    assert goals["credit_over_bound/rredcot-hf"]["ratio"] == pytest.approx(2.5)  # 100 GFLOP at 100 GFLOP/s: 1 s
    assert "credit_over_bound/rredcot-vllm" not in goals  # no value pass recorded there
    md = tmp_path / "page.md"
    md.write_text("# before\n\nkept\n")
    real_model.write_long_md(data, md)
    real_model.write_long_md(data, md)  # rewritten in place, not appended
    text = md.read_text()
    assert text.startswith("# before\n\nkept\n") and text.count(real_model.LONG_MD_BEGIN) == 1
    assert ("| RREDCoT step s / GRPO step s (GRPO on HF, step 1) | rredcot-hf | 1.30x | <= 1.2x | **no** |"
            in text)
    assert "| rredcot-hf-seed0 | credit (answer_probe) | 2.5 | forward bound | 1.0 | 2.50x |" in text
    assert "Samples of step 1 on HF: identical across grpo-hf-seed0, rredcot-hf-seed0" in text


def test_long_shape_smoke_on_the_embedded_model(tmp_path):
    """The whole long shape with tiny budgets: GRPO and RREDCoT on the same samples, a mixed group,
    the value pass counted, the decode row (no vLLM here)."""
    out = tmp_path / "long.json"
    proc = subprocess.run([sys.executable, "bench/real_model.py", "--shape", "long", "--smoke", "--vllm-python",
                           str(tmp_path / "no-python"), "--work", str(tmp_path / "work"), "--out", str(out),
                           "--md", str(tmp_path / "long.md")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    runs = {r["run"]: r for r in data["training"]}
    grpo, rredcot = runs[f"grpo-hf-seed{data['seed']}"], runs[f"rredcot-hf-seed{data['seed']}"]
    assert grpo["groups"]["mixed_groups"] and grpo["steps"][0]["signal"]
    assert grpo["groups"]["completions_sha256"] == rredcot["groups"]["completions_sha256"]
    value = rredcot["steps"][0]["value_pass"]
    assert value["probes"] > 0
    # the scorer runs at least the positions the bound counts (it pads and re-encodes traces)
    assert rredcot["steps"][0]["credit_forward_tokens"] >= value["trace_positions"] + value["probe_positions"]
    assert "rredcot_over_grpo_step/rredcot-hf" in data["goals"]
    assert [d["backend"] for d in data["decode"]] == ["hf"] and data["decode"][0]["tokens"] > 0
    assert "rredcot-hf-seed" in (tmp_path / "long.md").read_text()
    # --extend keeps the finished runs and runs none of them again
    again = subprocess.run([sys.executable, "bench/real_model.py", "--shape", "long", "--smoke", "--vllm-python",
                            str(tmp_path / "no-python"), "--work", str(tmp_path / "work"), "--extend", str(out),
                            "--out", str(tmp_path / "again.json")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "train " not in again.stdout and "decode " not in again.stdout
    extended = json.loads((tmp_path / "again.json").read_text())
    assert extended["training"] == data["training"] and len(extended["extended"]) == 1
