"""How fast the MC continuations decode (backends/continuations.py ``sample_continuations``, the HF backend's): the cost of the
`mc` method and of `rredcot judge`'s reference, at the default chain length and on long chains.

Prefixes are prompt + the first half of the gold solution's lines, for problems of one benchmark;
each gets ``--k`` continuations sampled by the shipped model at temperature 1 (the reference's
setting). Reports generated tokens per second of wall time and the continuation lengths.

    python bench/mc_decode.py --out results/long-chains/mc-decode/mc_decode.json

Timings are medians over ``--repeats`` runs in one process, one torch thread unless
``--threads``; run on a quiet machine or label the figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.policy.models import load_model_and_tokenizer
from rredcot_cli.policy.continuations import sample_continuations

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--prefixes", type=int, default=8, help="prefixes per setting")
    parser.add_argument("--k", type=int, default=8, help="continuations per prefix")
    parser.add_argument("--rows-per-forward", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    results = {}
    for name in args.settings:
        model_name, bench_name, overrides, max_new = SETTINGS[name]
        prefixes, (model, tokenizer) = prefixes_for(model_name, bench_name, overrides, args.prefixes)
        kwargs = dict(k=args.k, max_new_tokens=max_new, temperature=1.0, top_p=1.0,
                      eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, seed=0,
                      rows_per_forward=args.rows_per_forward)
        walls, stats = [], {}
        for _ in range(args.repeats):
            stats = {}
            started = time.perf_counter()
            conts = sample_continuations(model, prefixes, stats=stats, **kwargs)
            walls.append(time.perf_counter() - started)
        lengths = [len(c) for cs in conts for c in cs]
        wall = statistics.median(walls)
        results[name] = {
            "model": model_name, "benchmark": bench_name, "overrides": overrides, "max_new_tokens": max_new,
            "prefixes": len(prefixes), "k": args.k, "mean_prefix_tokens": statistics.mean(map(len, prefixes)),
            "mean_continuation_tokens": statistics.mean(lengths), "generated_tokens": stats["generated_tokens"],
            "wall_s": walls, "median_wall_s": wall, "tokens_per_s": stats["generated_tokens"] / wall,
        }
        print(f"{name:8s} prefix {results[name]['mean_prefix_tokens']:6.1f} tok, continuation "
              f"{results[name]['mean_continuation_tokens']:6.1f} tok, {stats['generated_tokens']} tokens in "
              f"{wall:6.2f} s = {results[name]['tokens_per_s']:7.0f} tok/s", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"commit": commit, "dirty": bool(subprocess.run(["git", "status", "--porcelain", "rredcot_cli"],
                                                             capture_output=True, text=True).stdout.strip()),
              "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                          "torch": torch.__version__},
              "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
