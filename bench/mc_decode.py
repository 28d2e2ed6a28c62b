"""How fast the MC continuations decode: the cost of the `mc` method and of `rredcot judge`'s
reference, at the default chain length and on long chains, on the HF backend and (``--backends hf
vllm``) on the vLLM backend.

Prefixes are prompt + the first half of the gold solution's lines, for problems of one benchmark
(token ids; ``--prefixes`` of them, mean length ``mean_prefix_tokens``); each gets ``--k``
continuations sampled by the shipped model at temperature 1, top-p 1, seed 0 (the reference's
setting), each continuation up to the setting's ``max_new_tokens`` (one budget for all). Every
backend is timed through the backend protocol's ``continuations`` (rredcot_cli/policy/base.py) on
the same prefixes with the same k and budget: ``HFBackend`` (rredcot_cli/policy/continuations.py's sampler)
and ``VLLMBackend`` (vLLM 0.32, ``n=k`` per prefix; on CPU: float32, ``enforce_eager``, the
backend's default 1 GiB KV cache, as tests/policy/test_vllm_backend.py builds it). The two draw
different random streams, so their continuation lengths agree in distribution, not exactly.

Per setting and backend the JSON has ``wall_s`` (seconds of each repeat; the median is
``median_wall_s``), ``generated_tokens`` (summed over all prefixes x k continuations, EOS
included), ``tokens_per_s`` (generated tokens / median wall seconds), ``mean_continuation_tokens``
(tokens per continuation); vLLM also ``engine_start_s`` (seconds to build the engine, once, not in
``wall_s``); with both backends ``vllm_over_hf_tokens_per_s`` (tokens/s ratio, > 1: vLLM faster).

    python bench/mc_decode.py --out results/long-chains/mc-decode/mc_decode.json
    .venv-vllm/bin/python bench/mc_decode.py --settings long --backends hf vllm --prefixes 4 --k 4 \\
        --repeats 1 --out results/long-chains/mc-decode/mc_decode_backends.json

Timings are medians over ``--repeats`` runs in one process, one thread unless ``--threads``
(torch's, which the in-process vLLM engine uses too: ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless
set, so vLLM does not bind its own threads); run on a quiet machine or label the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from measure import commit, git

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path

SETTINGS = {
    # name: (model, benchmark, benchmark overrides, max_new_tokens) -- the ladder's R1 and R4 rungs
    "default": ("embedded", "chain", {}, 256),
    "long": ("tiny-chain-verbose", "chain_verbose", {"min_steps": 4, "max_steps": 12}, 1264),
}


def prefixes_for(model_name: str, bench_name: str, overrides: dict, count: int) -> tuple[list[list[int]], object]:
    model, tokenizer = load_model_and_tokenizer(model_name, dtype="float32")
    benchmark = make_benchmark(bench_name, **overrides)
    prefixes = []
    for problem in benchmark.load("test", limit=count):
        lines = benchmark.solution(problem).split("\n")
        text = benchmark.prompt(problem) + "".join(line + "\n" for line in lines[: len(lines) // 2])
        prefixes.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prefixes, (model, tokenizer)


def make_backend(kind: str, model_name: str, model, tokenizer):
    """The backend as the toolkit builds it on CPU (policy/load.py; vLLM as its tests do)."""
    if kind == "hf":
        return HFBackend(model, tokenizer, device="cpu")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from rredcot_cli.policy.vllm import VLLMBackend

    return VLLMBackend(str(resolve_model_path(model_name)), tokenizer=tokenizer, dtype="float32", device="cpu",
                       enforce_eager=True, seed=0)


def time_backend(backend, prefixes: list[list[int]], repeats: int, **kwargs) -> dict:
    walls, stats, conts = [], {}, []
    for _ in range(repeats):
        stats = {}
        started = time.perf_counter()
        conts = backend.continuations(prefixes, stats=stats, **kwargs)
        walls.append(time.perf_counter() - started)
    wall = statistics.median(walls)
    return {"mean_continuation_tokens": statistics.mean(len(c) for cs in conts for c in cs),
            "generated_tokens": stats["generated_tokens"], "wall_s": walls, "median_wall_s": wall,
            "tokens_per_s": stats["generated_tokens"] / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--backends", nargs="+", default=["hf"], choices=["hf", "vllm"])
    parser.add_argument("--prefixes", type=int, default=8, help="prefixes per setting")
    parser.add_argument("--k", type=int, default=8, help="continuations per prefix")
    parser.add_argument("--rows-per-forward", type=int, default=64, help="the HF sampler's; vLLM batches itself")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # before any vLLM engine: its CPU worker disables the call

    results = {}
    for name in args.settings:
        model_name, bench_name, overrides, max_new = SETTINGS[name]
        prefixes, (model, tokenizer) = prefixes_for(model_name, bench_name, overrides, args.prefixes)
        kwargs = dict(k=args.k, max_new_tokens=max_new, temperature=1.0, top_p=1.0, seed=0,
                      rows_per_forward=args.rows_per_forward)
        record = results[name] = {
            "model": model_name, "benchmark": bench_name, "overrides": overrides, "max_new_tokens": max_new,
            "prefixes": len(prefixes), "k": args.k, "mean_prefix_tokens": statistics.mean(map(len, prefixes))}
        for kind in args.backends:
            started = time.perf_counter()
            backend = make_backend(kind, model_name, model, tokenizer)
            start_s = time.perf_counter() - started
            timing = time_backend(backend, prefixes, args.repeats, **kwargs)
            if kind == "vllm":
                timing = {"engine_start_s": start_s, **timing}
                backend.close()
            timing["torch_threads"] = torch.get_num_threads()
            record[kind] = timing
            print(f"{name:8s} prefix {record['mean_prefix_tokens']:6.1f} tok, continuation "
                  f"{timing['mean_continuation_tokens']:6.1f} tok, {timing['generated_tokens']} tokens in "
                  f"{timing['median_wall_s']:6.2f} s = {timing['tokens_per_s']:7.0f} tok/s"
                  + (f" (vllm; engine start {start_s:.1f} s)" if kind == "vllm" else ""), flush=True)
        if "hf" in record and "vllm" in record:
            record["vllm_over_hf_tokens_per_s"] = record["vllm"]["tokens_per_s"] / record["hf"]["tokens_per_s"]
            print(f"{name:8s} vllm/hf tokens/s: {record['vllm_over_hf_tokens_per_s']:.2f}x", flush=True)
    versions = {"torch": torch.__version__}
    if "vllm" in args.backends:
        import vllm

        versions["vllm"] = vllm.__version__
    record = {"commit": commit(), "dirty": bool(git("status", "--porcelain", "rredcot_cli")),
              "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                          "load_average": os.getloadavg(), **versions},
              "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
