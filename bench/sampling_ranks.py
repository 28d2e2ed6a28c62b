"""Sampling tokens/s at world size 1 and 2: vLLM (the CPU build, one engine per rank) against the HF
backend, on the same prompts with the same settings, as ``rredcot train`` samples a step.

    /path/to/.venv-vllm/bin/python bench/sampling_ranks.py      # -> results/vllm-ddp/sampling_ranks.json
    python bench/sampling_ranks.py --prompts 8 --repeats 1 --out /tmp/s.json   # a look

Each case is its own job (``torchrun --nproc-per-node=2`` for world size 2) running this file with
``--driver``: it loads the policy as the train stage does (embedded model, float32, CPU, one torch
thread per rank), makes one warm-up draw, then ``--repeats`` timed draws of ``--prompts`` chain
problems x ``--samples`` samples of up to ``--max-new-tokens`` tokens at temperature 1, each through
``pipeline.sample_rows`` with the train stage's sharding: the HF backend's chunks of
``backend.batch_size`` (64) go to the ranks in turn (``DataParallel.map_chunks``); vLLM takes every
prompt in one call and each rank's engine samples a contiguous share of it
(rredcot_cli/policy/engine_groups.py). tokens/s = generated tokens of a draw / the draw's wall
seconds (a barrier before and after, the slowest rank's time). The samples are the same at both
world sizes for a backend (``same_token_counts_across_world_sizes`` compares the draws' token
counts), not across backends.

``others_cores``: CPU (in cores) used by processes outside the bench while a case ran
(bench/measure.py's LoadWatcher). On this 2-core machine world size 2 puts a rank on each core,
so anything else running takes from it; the markdown (docs/vllm-ddp.md) labels busy numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from measure import LoadWatcher

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "runs" / "bench" / "vllm-ddp" / "sampling_ranks.json"))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt (sampling.n)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="*", default=["hf", "vllm"])
    parser.add_argument("--worlds", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--driver", action="store_true", help="internal: one case, run by this file")
    parser.add_argument("--backend", default="hf", help="internal: the driver's backend")
    args = parser.parse_args()
    if args.driver:
        return driver(args)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": " ".join(sys.argv), "python": sys.executable, "machine": _machine(),
              "settings": {k: getattr(args, k) for k in ("prompts", "samples", "max_new_tokens", "repeats")},
              "cases": []}
    for world in args.worlds:
        for backend in args.backends:
            driver_args = [str(Path(__file__).resolve()), "--driver", "--backend", backend,
                           "--prompts", str(args.prompts), "--samples", str(args.samples),
                           "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats)]
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}"]
            command = (launcher if world > 1 else [sys.executable]) + driver_args
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
            env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            started = time.perf_counter()
            with LoadWatcher() as watcher:
                proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
            case = {"backend": backend, "world_size": world, "job_seconds": round(time.perf_counter() - started, 1)}
            if proc.returncode != 0:
                case["error"] = proc.stderr[-3000:]
            else:
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                case.update(json.loads(lines[-1].removeprefix("RESULT ")))
            others = [s["others_cores"] for s in watcher.samples]
            case["others_cores"] = round(sum(others) / len(others), 2) if others else None
            result["cases"].append(case)
            out.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps({k: v for k, v in case.items() if k != "draws"}), file=sys.stderr)
    # Same samples at every world size (per backend): the draws' token counts agree.
    by_case = {(c["backend"], c["world_size"]): [d["tokens"] for d in c.get("draws", [])] for c in result["cases"]}
    result["same_token_counts_across_world_sizes"] = {
        backend: len({tuple(by_case.get((backend, w), ())) for w in args.worlds}) == 1 for backend in args.backends}
    out.write_text(json.dumps(result, indent=2) + "\n")


def driver(args) -> None:
    import torch

    from rredcot_cli.config.compose import compose
    from rredcot_cli.pipeline import sample_rows
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import load_policy
    from rredcot_cli.stages.common import make_benchmark, prompts_per_call
    # the train stage's process group and sharding: what is measured is sampling as train shards it
    from rredcot_cli.train import distributed

    torch.set_num_threads(1)
    parallel = distributed.init("ddp", 1200)
    parallel.shard_chunks = args.backend != "vllm"  # as the train stage sets it
    batch_size = 0 if args.backend == "vllm" else 64
    started = time.perf_counter()
    policy = load_policy(ModelConfig(chat_template=False), BackendConfig(name=args.backend, device="cpu", batch_size=batch_size),
                         seed=0)
    load_s = time.perf_counter() - started
    cfg = compose([])  # the default benchmark (chain) as rredcot train builds it
    benchmark = make_benchmark(cfg)
    problems = benchmark.load(cfg.benchmark.train_split, limit=args.prompts * (args.repeats + 1))

    per_call = prompts_per_call(batch_size, args.samples)
    draws = []
    for repeat in range(args.repeats + 1):  # draw 0 warms up
        chunk = problems[repeat * args.prompts : (repeat + 1) * args.prompts]
        parallel.barrier()
        began = time.perf_counter()
        rows = sample_rows(policy, benchmark, chunk, n=args.samples, max_new_tokens=args.max_new_tokens,
                           temperature=1.0, top_p=1.0, seed=repeat, prompts_per_call=per_call,
                           map_chunks=parallel.map_chunks)
        parallel.barrier()
        seconds = time.perf_counter() - began
        tokens = sum(r["num_tokens"] for r in rows)
        if repeat:
            draws.append({"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)})
    if parallel.is_main:
        total_tokens, total_s = sum(d["tokens"] for d in draws), sum(d["seconds"] for d in draws)
        print("RESULT " + json.dumps({"load_s": round(load_s, 1), "draws": draws,
                                      "tokens_per_s": round(total_tokens / total_s, 1),
                                      "completions_per_draw": len(rows)}), flush=True)
    parallel.barrier()
    if hasattr(policy.backend, "close") and parallel.distributed:
        policy.backend.close()  # tears the process group down with it (see stages/train.py)
    parallel.close()


def _machine() -> dict:
    import platform

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": os.getloadavg()}


if __name__ == "__main__":
    main()
