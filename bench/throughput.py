"""Training throughput of GRPO, RREDCoT and TRL's GRPOTrainer side by side, where a step's time
goes, and how fast the backends decode at the default length and at ~1,000 tokens.

    python bench/throughput.py                  # everything -> results/throughput/throughput.json, docs/studies/throughput.md
    python bench/throughput.py --steps 4 --repeats 1 --decode none --out /tmp/t.json --md /tmp/t.md   # a look
    PYTHONPATH=/dir/with/trl python bench/throughput.py   # with TRL's rows (trl 1.16 + datasets importable)
    python bench/throughput.py --write-md results/throughput/throughput.json   # (re)write the markdown only

Training. Every run is a real ``rredcot train`` (the embedded model and default config, seed 0,
``--steps`` steps, one held-out eval at the last step) in a process of its own with one torch
thread. The runs alternate, the order rotated every repeat (grpo, rredcot, trl; rredcot, trl,
grpo; ...), so drifting load hits every run alike. s/step and the phases are means over steps 2..N
(step 1 warms up) of ``train/metrics.parquet``'s ``seconds`` and ``seconds_<phase>`` columns
(rredcot_cli/train/steptime.py); tokens/s of a phase = the step's generated tokens / the phase's
seconds, and for value estimation also forward positions / second. The ratios are of the means
over repeats. TRL (when ``import trl`` works): its GRPOTrainer on the same model, prompts, reward
and budget (prompts x samples per round, 2 passes in minibatches of 32 = 4 optimizer steps,
lr 3e-5 cosine with 2 warm-up steps, beta 0, clip 0.2, up to 256 new tokens, T=1, AdamW betas
(0.9, 0.99), grad clip 1), run by this file as ``--trl-driver``; one round = one generation plus
its optimizer steps, timed per optimizer step; its "sampling" phase is TRL's
``_generate_and_score_completions`` (generation, reward and its old-log-prob pass).

Decode. One ``generate`` call of 8 prompts x 8 samples (``--decode-driver``, its own process,
one thread): the HF backend (growing KV cache, finished rows leaving the batch), the same through
transformers' ``generate`` with its default cache (``hf-generate``: the backend before issue 13),
and the vLLM CPU backend when ``--vllm-python`` names an
interpreter that imports vllm; at the default length (chain, ``max_new_tokens`` 256) and long
(chain with 130 steps, ``max_new_tokens`` 1024: ~950-token completions after ~400-token
prompts) and, with ``--long-model``, also *long-model*: that model on ``--long-benchmark``'s
chains with ``experiment=long_chains``' completion budget (1,264 tokens; long completions after
short prompts, as in the long-chain study). tokens/s = generated tokens / wall seconds of the call (a warm-up call first).
``--decode-driver --model M`` (bench/real_model.py) decodes with model M instead, its prompts
formatted as ``rredcot train`` formats them (``model.chat_template=auto``), on ``--benchmark``'s
train split (``--split``: another; ``--prompts`` of them, 8 by default) with ``--n`` samples and ``--max-new-tokens``
(``--ignore-eos``: every row runs to it, on either backend); ``--enforce-eager`` is vLLM's.
``--row-lengths L1,L2,...`` (vLLM only): request k of the timed call decodes exactly L_k tokens,
EOS ignored (bench/sampling_vs_vllm.py passes the lengths HF sampled, so that both backends do the
same work). The driver also reports ``load_s`` (load_policy), for vLLM ``engine_start_s`` (the
engine's constructor alone), every completion's length (``lengths``) and hashes of the prompts,
the sampled tokens and their log-probs.

``others_cores`` is the CPU (in cores) used by processes outside the bench while a run ran
(bench/measure.py's LoadWatcher): above ~0.15 on this 2-core machine the numbers are a busy
machine's, and the markdown says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from measure import (QUIET_CORES, bench_command, commit, git, machine, mean_step, result_line, run_watched,
                     train_steps, vllm_importable, write_json)

from rredcot_cli.store.artifacts import PHASES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DECODE_CASES = {"default": {"steps": None, "max_new_tokens": 256}, "long": {"steps": 130, "max_new_tokens": 1024},
                # the --long-model case; 1,264 = conf/experiment/long_chains.yaml's sampling.max_new_tokens
                "long-model": {"steps": None, "max_new_tokens": 1264}}
DECODE_BACKENDS = ("hf", "hf-unshared", "hf-bf16", "hf-generate", "vllm")


# =========================================================================== drivers (subprocesses)


def trl_driver(args: argparse.Namespace) -> None:
    """TRL's GRPOTrainer on the shipped model and chain prompts with the rredcot defaults' budget;
    prints one JSON line with the per-optimizer-step and per-generation times."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rredcot_cli.benchmarks.synthetic import ChainBenchmark
    from rredcot_cli.policy.models import resolve_model_path

    torch.set_num_threads(1)
    rounds, prompts, samples = args.steps, 8, 8
    bench = ChainBenchmark()
    problems = bench.load("train", limit=rounds * prompts)
    by_prompt = {bench.prompt(p): p for p in problems}

    def reward(completions, prompts, **kwargs):
        return [float(bench.verify(c, by_prompt[p]) or 0.0) for c, p in zip(completions, prompts)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.steps, self.t0 = [], None

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.steps.append(time.perf_counter() - self.t0)

    model_dir = str(resolve_model_path("embedded"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    batch = prompts * samples
    config = GRPOConfig(output_dir=str(Path(args.work) / "trl"), per_device_train_batch_size=32,
                        steps_per_generation=batch // 32, num_generations=samples, num_iterations=2,
                        max_completion_length=256, max_steps=2 * (batch // 32) * rounds, learning_rate=3e-5,
                        lr_scheduler_type="cosine", warmup_steps=2, beta=0.0, epsilon=0.2, temperature=1.0,
                        logging_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no",
                        gradient_checkpointing=False, dataloader_num_workers=0, shuffle_dataset=False,
                        adam_beta2=0.99, max_grad_norm=1.0, seed=0)
    timer = Timer()
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_list([{"prompt": bench.prompt(p)} for p in problems]),
                          processing_class=tokenizer, callbacks=[timer])
    generation = []
    inner = trainer._generate_and_score_completions

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            generation.append(time.perf_counter() - t0)

    trainer._generate_and_score_completions = timed
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    history = trainer.state.log_history
    lengths = [h["completions/mean_length"] for h in history if "completions/mean_length" in h]
    rewards = [h["reward"] for h in history if "reward" in h]
    import trl

    print("TRL_RESULT " + json.dumps({"trl": trl.__version__, "rounds": rounds, "optimizer_steps_per_round":
                                      2 * (batch // 32), "step_seconds": timer.steps,
                                      "generation_seconds": generation, "train_wall_s": wall,
                                      "mean_lengths": lengths, "rewards": rewards, "batch": batch}))


def fixed_length_requests(lengths: list[int]) -> list[dict]:
    """vLLM SamplingParams settings that make request k decode exactly ``lengths[k]`` tokens: its
    ``max_tokens``, with EOS and the generation config's stop tokens ignored (``ignore_eos``)."""
    if not lengths or any(n < 1 for n in lengths):
        raise ValueError(f"row lengths must be >= 1 each, one per request; got {lengths}")
    return [{"max_tokens": n, "ignore_eos": True} for n in lengths]


class PerRequestParams:
    """Stands in for ``vllm.SamplingParams`` while the timed call builds its requests (the vLLM
    backend makes one n=1 request per sample, prompt-major, in ``_generate``): the k-th params made
    get ``settings[k]`` on top of what the backend asked for. ``used`` counts them, so that the
    driver can check that every setting went to exactly one request."""

    def __init__(self, make, settings: list[dict]):
        self.make, self.settings, self.used = make, settings, 0

    def __call__(self, *args, **kwargs):
        if self.used == len(self.settings):
            raise RuntimeError(f"the call made more than the {len(self.settings)} requests given --row-lengths")
        kwargs.update(self.settings[self.used])
        self.used += 1
        return self.make(*args, **kwargs)


def decode_driver(args: argparse.Namespace) -> None:
    """One warm-up call, then one timed generate call of 8 prompts x 8 samples; prints JSON."""
    import torch

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import encode_prompt, format_prompt, load_policy

    torch.set_num_threads(1)
    case = DECODE_CASES[args.case]
    backend = "vllm" if args.backend == "vllm" else "hf"
    long_model = args.long_model if args.case == "long-model" else None
    engine: dict[str, float] = {}
    if backend == "vllm":  # the engine's start alone (load_policy also loads the HF copy)
        from rredcot_cli.policy import vllm as vllm_backend

        real_init = vllm_backend.VLLMBackend.__init__

        def timed_init(self, *a, **k):
            t0 = time.perf_counter()
            real_init(self, *a, **k)
            engine["engine_start_s"] = time.perf_counter() - t0

        vllm_backend.VLLMBackend.__init__ = timed_init
    load_started = time.perf_counter()
    # --model: a real model, prompted as rredcot train prompts it (model.chat_template=auto)
    policy = load_policy(ModelConfig(path=args.model or long_model or "embedded", chat_template="auto" if args.model else False),
                         BackendConfig(name=backend, device="cpu", batch_size=0 if backend == "vllm" else 64,
                                       enforce_eager=args.enforce_eager), seed=0)
    engine["load_s"] = time.perf_counter() - load_started
    if args.backend == "hf-generate":  # the HF backend before issue 13: generate with its own cache
        policy.backend.growing_cache = policy.backend.compact = False
    if args.backend == "hf-unshared":  # each row reads its own copy of its prompt's keys and values
        policy.backend.share_prompts = False
    if args.backend == "hf-bf16":  # keys and values in bfloat16
        policy.backend.kv_dtype = torch.bfloat16
    if args.model:
        bench = make_benchmark(args.benchmark)
    elif long_model:  # a model that writes long completions itself, on its own benchmark's default chains
        bench = make_benchmark(args.long_benchmark)
    else:
        bench = make_benchmark("chain", **({"min_steps": case["steps"], "max_steps": case["steps"]}
                                          if case["steps"] else {}))
    # policy.chat_template is False unless --model: the plain prompts as before
    prompts = [encode_prompt(policy.tokenizer, format_prompt(policy.tokenizer, bench.prompt(p), policy.chat_template),
                             policy.chat_template) for p in bench.load(args.split if args.model else "train", limit=args.prompts)]
    if args.ignore_eos and backend == "hf":  # every row runs to max_new_tokens (bench/hf_sampling.py's long shape); -1: no model samples it
        policy.backend.eos_ids = [-1]
    if args.ignore_eos and backend == "vllm":  # the same on vLLM: its own flag, on every request the backend makes
        import vllm  # optional dependency, loaded by load_policy above

        vllm.SamplingParams = functools.partial(vllm.SamplingParams, ignore_eos=True)
    params = SamplingParams(n=args.n or 8, max_new_tokens=args.max_new_tokens or case["max_new_tokens"], temperature=1.0)
    policy.backend.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=8, temperature=1.0), seed=1)  # warm-up
    per_request = None
    if args.row_lengths:  # after the warm-up: only the timed call's requests get the lengths
        import vllm  # optional dependency, loaded by load_policy above

        wanted = [int(n) for n in args.row_lengths.split(",")]
        if len(wanted) != len(prompts) * params.n:
            print(f"--row-lengths: {len(wanted)} lengths for {len(prompts)} prompts x {params.n} samples; "
                  "pass one per completion, prompt-major", file=sys.stderr)
            raise SystemExit(2)
        per_request = vllm.SamplingParams = PerRequestParams(vllm.SamplingParams, fixed_length_requests(wanted))
    c0, t0 = time.process_time(), time.perf_counter()
    groups = policy.backend.generate(prompts, params, seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    lengths = [len(c.token_ids) for g in groups for c in g]
    if per_request is not None and (per_request.used != len(wanted) or lengths != wanted):
        raise SystemExit(f"--row-lengths: asked for {wanted} in {len(wanted)} requests, the call made "
                         f"{per_request.used} and decoded {lengths}")
    print("DECODE_RESULT " + json.dumps({
        "backend": args.backend, "case": args.case, "rredcot_cli": str(Path(sys.modules["rredcot_cli"].__file__).parent), "model": args.model or long_model or "embedded", **engine,
        "n": params.n, "max_new_tokens": params.max_new_tokens, "completions": len(lengths), "tokens": sum(lengths),
        "mean_tokens": sum(lengths) / len(lengths), "max_tokens": max(lengths),
        "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "wall_s": wall, "cpu_s": cpu,
        "tokens_per_s": sum(lengths) / wall, "tokens_per_cpu_s": sum(lengths) / cpu,
        "lengths": lengths, "row_lengths_given": per_request is not None,
        # the prompts and the samples themselves: equal hashes = the same token ids in the same order
        "prompts_sha256": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "tokens_sha256": hashlib.sha256(json.dumps([c.token_ids for g in groups for c in g]).encode()).hexdigest(),
        "logprobs_sha256": hashlib.sha256(json.dumps([c.logprobs for g in groups for c in g]).encode()).hexdigest()}))


# =========================================================================== the bench


def run_rredcot(method: str, steps: int, work: Path, repeat: int, extra: list[str]) -> dict:
    run_dir = work / f"{method}-r{repeat}"
    cmd = [sys.executable, "-m", "rredcot_cli", "train", f"method={method}", "seed=0", f"train.steps={steps}",
           f"train.eval_every={steps}", "train.save_every=0", "train.save_rollouts=0", "backend.num_threads=1",
           f"run.dir={run_dir}", "run.overwrite=true", *extra]
    proc, info, _ = run_watched(cmd, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, f"{method} repeat {repeat}")
    result = {"run": method, "repeat": repeat, **info}
    if proc.returncode:
        return result
    summary = json.loads((run_dir / "train" / "summary.json").read_text())
    steps_out = [{"step": s["row"]["step"], "seconds": s["row"]["seconds"], "tokens": s["tokens"],
                  "credit_forward_tokens": s["row"].get("credit_forward_tokens"), "phases": s["phases"],
                  "reward_mean": s["row"]["reward_mean"]} for s in train_steps(run_dir / "train")]
    result.update(steps=steps_out, eval_after=summary["eval_after"].get("pass@1"),
                  eval_before=summary["eval_before"].get("pass@1"), train_seconds=summary["seconds"])
    result["mean"] = mean_step([s for s in steps_out if s["step"] > 1])
    # the eval ran at the last step, outside its seconds
    result["mean"]["phases"]["eval"] = sum(s["phases"]["eval"] for s in steps_out)
    print(f"  {result['mean']['s_per_step']:.2f} s/step  " + "  ".join(
        f"{p} {v:.2f}" for p, v in result["mean"]["phases"].items() if v) + f"  others_cores {info['others_cores_mean']}",
        flush=True)
    return result


def run_trl(steps: int, work: Path, repeat: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--trl-driver", "--steps", str(steps), "--work",
           str(work / f"trl-r{repeat}")]
    proc, info, _ = run_watched(cmd, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}, f"trl repeat {repeat}")
    result = {"run": "trl", "repeat": repeat, **info}
    data = result_line(proc.stdout, "TRL_RESULT")
    if proc.returncode or data is None:
        return result
    per = data["optimizer_steps_per_round"]
    rounds = [sum(data["step_seconds"][r * per : (r + 1) * per]) for r in range(len(data["step_seconds"]) // per)]
    generation = data["generation_seconds"][: len(rounds)]
    # completions/mean_length: one entry per generation (or per optimizer step when TRL logs each)
    lengths = data["mean_lengths"]
    if len(lengths) >= len(data["step_seconds"]):
        lengths = lengths[::per]
    lengths = (lengths + [None] * len(rounds))[: len(rounds)]
    steps_out = [{"step": r + 1, "seconds": rounds[r], "tokens": lengths[r] * data["batch"] if lengths[r] else None,
                  "credit_forward_tokens": None, "reward_mean": None,
                  "phases": {**dict.fromkeys(PHASES, 0.0), "sampling": generation[r] if r < len(generation) else 0.0,
                             "update": rounds[r] - (generation[r] if r < len(generation) else 0.0)}}
                 for r in range(len(rounds))]
    result.update(trl=data["trl"], steps=steps_out, train_seconds=data["train_wall_s"],
                  mean=mean_step([s for s in steps_out if s["step"] > 1]))
    print(f"  {result['mean']['s_per_step']:.2f} s/round  others_cores {info['others_cores_mean']}", flush=True)
    return result


def run_decode(backend: str, case: str, python: str, long_model: str | None, long_benchmark: str) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--decode-driver", "--backend", backend, "--case", case]
    if case == "long-model":
        cmd += ["--long-model", long_model, "--long-benchmark", long_benchmark]
    proc, info, _ = run_watched(cmd, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                                      "VLLM_CPU_OMP_THREADS_BIND": "nobind"}, f"decode {backend} {case}")
    decoded = result_line(proc.stdout, "DECODE_RESULT")
    result = {"backend": backend, "case": case, **info}
    if decoded:
        result.update(decoded)
        print(f"  {result['tokens']} tokens (mean {result['mean_tokens']:.0f}) in {result['wall_s']:.1f} s: "
              f"{result['tokens_per_s']:.0f} tok/s", flush=True)
    return result


def trl_importable() -> bool:
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def summarize(data: dict) -> None:
    """Means over repeats per run, and the ratios."""
    by_run: dict[str, list[dict]] = {}
    for r in data["training"]:
        if r.get("mean"):
            by_run.setdefault(r["run"], []).append(r)
    means = {}
    for run, results in by_run.items():
        s = [r["mean"]["s_per_step"] for r in results]
        means[run] = {"s_per_step": statistics.fmean(s), "per_repeat": s,
                      "tokens_per_step": statistics.fmean(r["mean"]["tokens_per_step"] for r in results
                                                          if r["mean"]["tokens_per_step"]) if any(
                          r["mean"]["tokens_per_step"] for r in results) else None,
                      "phases": {p: statistics.fmean(r["mean"]["phases"][p] for r in results) for p in PHASES},
                      "credit_forward_tokens": statistics.fmean(
                          [r["mean"]["credit_forward_tokens"] for r in results if r["mean"]["credit_forward_tokens"]])
                      if any(r["mean"]["credit_forward_tokens"] for r in results) else None,
                      "whole_run_s": statistics.fmean(r["wall_s"] for r in results),
                      "cpu_s": statistics.fmean(r["cpu_s"] for r in results),
                      "eval_after": [r.get("eval_after") for r in results],
                      "others_cores_mean": statistics.fmean(r["others_cores_mean"] or 0.0 for r in results)}
    ratios = {}
    per_repeat = {(r["run"], r["repeat"]): r for results in by_run.values() for r in results}
    for key, (top, bottom) in {"rredcot_over_grpo": ("rredcot", "grpo"), "trl_over_grpo": ("trl", "grpo")}.items():
        if top in means and bottom in means:
            ratios[key] = means[top]["s_per_step"] / means[bottom]["s_per_step"]
            # the same ratio within each repeat (runs next to each other), with both runs' load
            ratios[key + "_per_repeat"] = [
                {"repeat": rep, "ratio": per_repeat[(top, rep)]["mean"]["s_per_step"]
                 / per_repeat[(bottom, rep)]["mean"]["s_per_step"],
                 "others_cores": [per_repeat[(top, rep)]["others_cores_mean"],
                                  per_repeat[(bottom, rep)]["others_cores_mean"]]}
                for rep in sorted({r for (_, r) in per_repeat}) if (top, rep) in per_repeat and (bottom, rep) in per_repeat]
    decode = decode_rates(data)
    for backend in DECODE_BACKENDS:
        for case, suffix in (("long", ""), ("long-model", "_model")):
            if (backend, "default") in decode and (backend, case) in decode:
                ratios[f"{backend}_default_over_long{suffix}_tokens_per_s"] = (
                    decode[(backend, "default")] / decode[(backend, case)])
    data["means"], data["ratios"] = means, ratios


def decode_rates(data: dict) -> dict[tuple[str, str], float]:
    """(backend, case) -> median tokens/s over the decode repeats."""
    rates: dict[tuple[str, str], list[float]] = {}
    for d in data.get("decode", []):
        if "tokens_per_s" in d:
            rates.setdefault((d["backend"], d["case"]), []).append(d["tokens_per_s"])
    return {key: statistics.median(values) for key, values in rates.items()}


# --------------------------------------------------------------------------- the write-up


def write_md(data: dict, path: Path) -> None:
    m, ratios = data["means"], data["ratios"]
    loads = [r.get("others_cores_mean") or 0.0 for r in data["training"] + data.get("decode", [])]
    busy = any(v > QUIET_CORES for v in loads)
    mach = data["machine"]
    L = ["# Throughput: GRPO, RREDCoT and TRL side by side\n"]
    L.append(f"Measured {data['date']} with `bench/throughput.py` at commit `{data['commit']}`"
             f"{' (with uncommitted changes)' if data.get('dirty') else ''} (raw numbers: "
             f"`{data.get('json_name', 'results/throughput/throughput.json')}`). Machine: {mach['cpu_model']}, "
             f"{mach['logical_cpus']} logical CPUs, {mach['mem_gb']} GB, torch {mach['torch']}, Python {mach['python']}; "
             f"one torch thread per run. Embedded model, default config, seed 0, {data['steps']} steps per run, "
             f"{data['repeats']} repeat(s), runs alternating; s/step = mean over steps 2..{data['steps']}.\n")
    if busy:
        L.append(f"**Busy machine**: other processes used up to {max(loads):.2f} cores (mean per run in the tables, "
                 "*others*); on 2 cores every 0.1 core is 5% of the machine. Read the ratios, not the seconds, and "
                 "rerun on a quiet machine for final figures.\n")
    else:
        L.append("Quiet machine: no run saw more than 0.15 cores used by other processes.\n")
    L.append("## Ratios\n")

    def paired(key: str) -> str:
        pairs = ratios.get(key + "_per_repeat", [])
        return "; per repeat: " + ", ".join(
            f"{p['ratio']:.2f} (others {p['others_cores'][0] or 0:.2f}/{p['others_cores'][1] or 0:.2f})"
            for p in pairs) if len(pairs) > 1 else ""

    if "rredcot_over_grpo" in ratios:
        L.append(f"- **RREDCoT / GRPO** (s/step): **{ratios['rredcot_over_grpo']:.2f}x**{paired('rredcot_over_grpo')}")
    if "trl_over_grpo" in ratios:
        L.append(f"- **GRPO speed-up over TRL GRPOTrainer** (TRL s/round / GRPO s/step): "
                 f"**{ratios['trl_over_grpo']:.2f}x**{paired('trl_over_grpo')}")
    for backend in DECODE_BACKENDS:
        for suffix, what in (("", "on 130-step chains (~950 tokens after ~400-token prompts)"),
                             ("_model", "with the long-chain model (long completions after short prompts)")):
            key = f"{backend}_default_over_long{suffix}_tokens_per_s"
            if key in ratios:
                L.append(f"- {backend} decode: tokens/s at the default length / {what}: {ratios[key]:.2f}x")
    L.append("")
    L.append("## Training step\n")
    L.append("| run | s/step | per repeat | generated tokens/step | tokens/s | whole run s | CPU s | eval pass@1 after "
             "| others |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for run, v in m.items():
        tps = f"{v['tokens_per_step'] / v['s_per_step']:,.0f}" if v["tokens_per_step"] else "-"
        evals = ", ".join(f"{e:.3f}" for e in v["eval_after"] if e is not None) or "-"
        L.append(f"| {run} | {v['s_per_step']:.2f} | {', '.join(f'{s:.2f}' for s in v['per_repeat'])} | "
                 f"{v['tokens_per_step'] or 0:,.0f} | {tps} | {v['whole_run_s']:.0f} | {v['cpu_s']:.0f} | {evals} | "
                 f"{v['others_cores_mean']:.2f} |")
    L.append("\n*whole run* and *CPU s* include start-up, the held-out evals before and after, and saving; TRL's "
             "include neither evals nor start-up of a rredcot run, so compare s/step.\n")
    L.append("## Where a step's time goes\n")
    L.append("Seconds per step (mean over steps and repeats) and throughput: tokens/s = generated tokens of the step "
             "/ the phase's seconds; value estimation also in forward positions/s. *eval* is the one held-out eval "
             "at the last step (not in s/step). TRL's *sampling* is its `_generate_and_score_completions` (generation, "
             "reward, old log-probs), its *update* the rest of a round.\n")
    L.append("| run | phase | s/step | share of step | tokens/s | positions/s |")
    L.append("|---|---|---|---|---|---|")
    for run, v in m.items():
        for phase in PHASES:
            sec = v["phases"][phase]
            if sec < 0.005:  # phases this run does not have (a few ms of bookkeeping)
                continue
            share = f"{sec / v['s_per_step']:.0%}" if phase != "eval" else "-"
            tps = f"{v['tokens_per_step'] / sec:,.0f}" if v["tokens_per_step"] and phase != "eval" else "-"
            pps = f"{v['credit_forward_tokens'] / sec:,.0f}" if phase == "credit" and v["credit_forward_tokens"] else "-"
            L.append(f"| {run} | {phase} | {sec:.3f} | {share} | {tps} | {pps} |")
    if data.get("decode"):
        L.append("\n## Decode\n")
        L.append("One generate call of 8 prompts x 8 samples, one thread. *default*: chain, up to 256 new tokens; "
                 "*long*: chain with 130 steps, up to 1,024 new tokens; *long-model*: the model named in the case on its "
                 "own benchmark, up to 1,264 new tokens (the long-chain study's budget). `hf` is the "
                 "HF backend (growing KV cache, finished rows leave the batch, a prompt's samples share its keys and "
                 "values), `hf-unshared` the same with a copy of the prompt per sample, `hf-bf16` the same with "
                 "`backend.kv_cache_dtype=bfloat16`, `hf-generate` transformers' "
                 "generate with its default cache (the backend before issue 13), `vllm` the vLLM CPU build.\n")
        L.append("| backend | case | completions | mean prompt tokens | mean / max new tokens | wall s | tokens/s | "
                 "tokens/CPU-s | default / this | others |")
        L.append("|---|---|---|---|---|---|---|---|---|---|")
        rates = decode_rates(data)
        for d in data["decode"]:
            if "tokens_per_s" not in d:
                L.append(f"| {d['backend']} | {d['case']} | failed (rc {d['returncode']}) | | | | | | | |")
                continue
            base = rates.get((d["backend"], "default"))
            case = d["case"] if d.get("model", "embedded") == "embedded" else f"{d['case']} ({d['model']})"
            L.append(f"| {d['backend']} | {case} | {d['completions']} | {d['mean_prompt_tokens']:.0f} | "
                     f"{d['mean_tokens']:.0f} / {d['max_tokens']} | {d['wall_s']:.1f} | {d['tokens_per_s']:,.0f} | "
                     f"{d['tokens_per_cpu_s']:,.0f} | {base / d['tokens_per_s']:.2f} | "
                     f"{d.get('others_cores_mean') or 0:.2f} |")
        if any(len([d for d in data["decode"] if (d["backend"], d["case"]) == key]) > 1 for key in rates):
            L.append("\nRepeated calls are listed in the order they ran; *default / this* divides by the median "
                     "default-length rate of the backend, and the ratios above are of medians.")
    for note in data.get("notes", []):
        L.append(note + "\n")
    L.append("\n## Reproduce\n")
    L.append("```\n" + data["bench_command"] + "\n```\n")
    L.append("which ran:\n")
    L.append("```\n" + "\n".join(r["command"] for r in data["training"] + data.get("decode", [])) + "\n```\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--decode-driver", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="hf", help=argparse.SUPPRESS)
    ap.add_argument("--case", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--long-model", default=None,
                    help="also decode with this model (e.g. tiny-chain-verbose) on --long-benchmark's default "
                         "chains, beside the embedded model on 130-step chains (case long-model)")
    ap.add_argument("--long-benchmark", default="chain_verbose", help="benchmark of --long-model")
    # --decode-driver only (bench/real_model.py); the defaults leave the driver as it was
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--benchmark", default="chain", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--max-new-tokens", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--enforce-eager", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--split", default="train", help=argparse.SUPPRESS)  # the prompts' split (--model only)
    ap.add_argument("--ignore-eos", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--row-lengths", default=None, help=argparse.SUPPRESS)  # vLLM: exact length per request
    ap.add_argument("--steps", type=int, default=10, help="training steps (TRL: rounds) per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each method, alternating")
    ap.add_argument("--methods", default="grpo,rredcot", help="rredcot methods to time (trl is added when importable)")
    ap.add_argument("--trl", choices=("auto", "off"), default="auto", help="auto: TRL's rows when `import trl` works")
    ap.add_argument("--decode", default="hf,hf-generate,vllm",
                    help="decode backends to time (comma list of hf, hf-unshared, hf-generate, vllm; none: no decode table)")
    ap.add_argument("--decode-repeats", type=int, default=1,
                    help="time every decode case this many times (rounds alternate; ratios use the medians)")
    ap.add_argument("--vllm-python", default=".venv-vllm/bin/python",
                    help="an interpreter with vllm and this project installed, for the vllm decode rows (default: CI's vLLM-lane venv)")
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "throughput" / "throughput.json"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "studies" / "throughput.md"))
    ap.add_argument("--write-md", metavar="JSON", help="only (re)write the markdown from a result file")
    ap.add_argument("overrides", nargs="*", help="extra rredcot overrides for the training runs")
    args = ap.parse_args()
    if args.trl_driver:
        return trl_driver(args)
    if args.row_lengths and (not args.decode_driver or args.backend != "vllm"):
        ap.error("--row-lengths sets vLLM's per-request lengths: use it with --decode-driver --backend vllm")
    if args.decode_driver:
        return decode_driver(args)
    if args.write_md:
        return write_md(json.loads(Path(args.write_md).read_text()), Path(args.md))
    work = Path(args.work or tempfile.mkdtemp(prefix="rredcot-throughput-"))
    runs = [m for m in args.methods.split(",") if m]
    if args.trl == "auto" and trl_importable():
        runs.append("trl")
    elif args.trl == "auto":
        print("trl is not importable here: no TRL rows (PYTHONPATH=<dir with trl and datasets> adds them)")
    data = {"date": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "commit": commit(),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "steps": args.steps,
            "repeats": args.repeats, "runs": runs, "json_name": os.path.relpath(args.out, ROOT),
            "bench_command": bench_command("throughput.py"), "training": [], "decode": []}

    def save() -> None:
        summarize(data)
        write_json(Path(args.out), data)

    t0 = time.perf_counter()
    for repeat in range(args.repeats):
        order = runs[repeat % len(runs):] + runs[: repeat % len(runs)]
        for run in order:
            if run == "trl":
                data["training"].append(run_trl(args.steps, work, repeat))
            else:
                data["training"].append(run_rredcot(run, args.steps, work, repeat, args.overrides))
            save()
    backends = [b for b in args.decode.split(",") if b and b != "none"]
    cases = [c for c in DECODE_CASES if c != "long-model" or args.long_model]
    for case in [c for _ in range(args.decode_repeats) for c in cases]:
        for backend in backends:
            if backend == "vllm" and not vllm_importable(args.vllm_python):
                print(f"no vllm decode rows: {args.vllm_python} cannot import vllm and rredcot_cli")
                continue
            python = args.vllm_python if backend == "vllm" else sys.executable
            data["decode"].append(run_decode(backend, case, python, args.long_model, args.long_benchmark))
            save()
    data["total_wall_s"] = time.perf_counter() - t0
    save()
    write_md(data, Path(args.md))
    print(f"wrote {args.out} and {args.md} in {data['total_wall_s'] / 60:.1f} min: {json.dumps(data['ratios'])}")


if __name__ == "__main__":
    main()
