"""HF sampling against vLLM's standalone rate on the real model, both lengths, paired (issue 42 item 2).

    python bench/sampling_vs_vllm.py --vllm-python .venv-vllm/bin/python \
        --out results/real-model-speed/sampling_vs_vllm.json        # ~20 min on a quiet core

Each measurement is one ``bench/throughput.py --decode-driver`` process (bench/real_model.py's
``run_decode``: one torch thread, the backend loaded as ``rredcot train`` loads it, a warm-up call,
then one timed ``generate`` call; vLLM with ``enforce_eager``) on SmolLM2-135M-Instruct in fp32,
seed 0, with the CPU other processes used meanwhile (``others_cores``; above ~0.15 the figure is a
busy machine's). HF and vLLM alternate within a shape, ``--repeats`` rounds. Two ratios per round,
both in the JSON (``ratios.<shape>``), by wall and per CPU second:

- ``own_samples``: vLLM's tokens/s on its own samples over HF's on HF's. With EOS ending rows the
  two differ in length (on the short shape vLLM's had 25% more tokens in about the same number of
  steps, since a call runs to its longest row), so this compares different work.
- ``same_lengths`` (the shapes of ``--same-lengths``; short by default): a third call per round,
  vLLM decoding exactly HF's per-row lengths of that round (request k: ``max_tokens`` = the length
  HF sampled for row k, EOS included, and ``ignore_eos``; ``--row-lengths`` of the driver). Same
  prompts, same rows, same lengths (the driver checks them, and the JSON records both runs'
  ``lengths`` and ``prompts_sha256``), so the ratio is one of times: HF's seconds over vLLM's.

Shapes:

- *short*: arith's train split, 8 prompts x 4 samples, up to 128 new tokens, EOS ends a row (the
  short-answer tail: most rows finish early and a call runs to its longest row; the shape of the
  committed quiet figures, 69.3 against 133.8 tok/s).
- *long*: GSM8K's test split, 2 prompts x 8 samples (bench/real_model.py's long shape), every row
  decoding 1,024 tokens (``--ignore-eos`` on both backends). The two backends draw different
  samples from different random streams; with EOS ignored both decode the same number of tokens at
  the same lengths, so their rates compare the same work (with EOS, HF's 655-token mean against
  vLLM's 472 in the long-chain profile compared different work).

With two rounds or more each ratio also gets its geometric mean and a 95% Student-t interval on the
logs (one round cannot carry a ratio on this VM: identical calls vary by a third). ``--pool A.json
B.json --shapes short`` measures nothing: it gives the same over the rounds of several invocations.

Goal (issue 42): HF within 1.5x of vLLM standalone at both lengths.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
from pathlib import Path

from measure import commit, machine, vllm_importable
from rredcot_cli.metrics import mean_ci
from real_model import MODEL_PATH, THREAD_ENV, run_decode

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.5
SHAPES = {
    "short": ("arith", ["--n", "4", "--max-new-tokens", "128"]),
    "long": ("gsm8k", ["--split", "test", "--prompts", "2", "--n", "8", "--max-new-tokens", "1024", "--ignore-eos"]),
}


# the long shape ignores EOS on both backends: every row decodes 1,024 tokens, the same work already
SAME_LENGTHS_SHAPES = "short"


def ratios(runs: list[dict], shape: str) -> dict:
    """Per round: vLLM's tokens/s on its own samples over HF's, by wall and per CPU second; their medians."""
    by_round: dict[int, dict] = {}
    for r in runs:
        if r["shape"] == shape and "tokens_per_s" in r and not r.get("row_lengths_given"):
            by_round.setdefault(r["round"], {})[r["backend"]] = r
    wall = [p["vllm"]["tokens_per_s"] / p["hf"]["tokens_per_s"] for p in by_round.values() if len(p) == 2]
    cpu = [p["vllm"]["tokens_per_cpu_s"] / p["hf"]["tokens_per_cpu_s"] for p in by_round.values() if len(p) == 2]
    if not wall:
        return {}
    return {"by_wall": wall, "per_cpu_s": cpu, "median_by_wall": statistics.median(wall),
            "median_per_cpu_s": statistics.median(cpu), "goal": GOAL,
            "met_by_wall": statistics.median(wall) <= GOAL,
            "others_cores_max": max(r["others_cores_mean"] for r in runs if r["shape"] == shape)}


def row_lengths_args(hf_run: dict) -> list[str]:
    """The decode driver's arguments that make vLLM decode the rows of ``hf_run`` at HF's lengths."""
    return ["--row-lengths", ",".join(str(n) for n in hf_run["lengths"])]


def run_round(measure, same_lengths: bool) -> None:
    """One round of a shape: HF, vLLM on its own samples, then (``same_lengths``, and HF's call
    succeeded) vLLM at HF's per-row lengths. ``measure(backend, extra driver arguments)`` runs one
    call and returns its result."""
    hf = measure("hf", [])
    measure("vllm", [])
    if same_lengths and "lengths" in hf:
        measure("vllm", row_lengths_args(hf))


def same_lengths_ratios(runs: list[dict], shape: str) -> dict:
    """Per round where vLLM decoded HF's per-row lengths on the same prompts: HF's seconds over
    vLLM's (= vLLM's tokens/s over HF's on the same tokens), by wall and per CPU second; medians."""
    pairs = []
    for round_ in sorted({r["round"] for r in runs if r["shape"] == shape}):
        done = [r for r in runs if r["shape"] == shape and r["round"] == round_ and "tokens_per_s" in r]
        hf = next((r for r in done if r["backend"] == "hf"), None)
        vllm = next((r for r in done if r["backend"] == "vllm" and r.get("row_lengths_given")), None)
        if hf and vllm and hf["lengths"] == vllm["lengths"] and hf["prompts_sha256"] == vllm["prompts_sha256"]:
            pairs.append((hf, vllm))
    if not pairs:
        return {}
    wall = [hf["wall_s"] / vllm["wall_s"] for hf, vllm in pairs]
    cpu = [hf["cpu_s"] / vllm["cpu_s"] for hf, vllm in pairs]
    return {"by_wall": wall, "per_cpu_s": cpu, "median_by_wall": statistics.median(wall),
            "median_per_cpu_s": statistics.median(cpu), "goal": GOAL,
            "met_by_wall": statistics.median(wall) <= GOAL, "tokens": [hf["tokens"] for hf, _ in pairs],
            "others_cores_max": max(r["others_cores_mean"] for pair in pairs for r in pair)}


def geometric_interval(ratios_: list[float], confidence: float = 0.95) -> dict:
    """The geometric mean of per-round ratios and its Student-t interval, taken on their logs (a
    ratio's noise is multiplicative: a call 20% slower scales it, whichever backend it hits)."""
    mean, low, high = mean_ci([math.log(r) for r in ratios_], confidence)
    return {"rounds": len(ratios_), "geometric_mean": math.exp(mean), "confidence": confidence,
            "low": math.exp(low), "high": math.exp(high)}


def pooled(records: list[dict], shape: str) -> dict:
    """Both ratios of ``shape`` over the rounds of several invocations (each record's rounds
    renumbered after the previous ones'), with their geometric means and intervals."""
    runs = []
    for record in records:
        first = 1 + max((r["round"] for r in runs), default=-1)
        runs += [{**r, "round": first + r["round"]} for r in record["runs"] if r["shape"] == shape]
    result = {}
    for kind, measure in (("own_samples", ratios), ("same_lengths", same_lengths_ratios)):
        r = measure(runs, shape)
        if len(r.get("by_wall", [])) >= 2:  # an interval needs two rounds
            r.update(by_wall_interval=geometric_interval(r["by_wall"]), per_cpu_s_interval=geometric_interval(r["per_cpu_s"]))
        result[kind] = r
    return result


def summary_line(shape: str, kind: str, r: dict) -> str:
    """One printed line per ratio: the medians, and with two rounds or more the interval by wall."""
    line = (f"{shape}, {kind}: vLLM / HF = {r['median_by_wall']:.2f}x by wall (median), {r['median_per_cpu_s']:.2f}x "
            f"per CPU s (goal <= {GOAL}x; others' cores up to {r['others_cores_max']:.2f})")
    if "by_wall_interval" in r:
        i = r["by_wall_interval"]
        line += (f"; geometric mean {i['geometric_mean']:.2f}x [{i['low']:.2f}, {i['high']:.2f}] by wall over "
                 f"{i['rounds']} rounds ({i['confidence']:.0%} t-interval)")
    return line


def pool_main(paths: list[str], shape: str, out: str) -> None:
    """--pool: the ratios over the rounds of the given JSON files, printed and written to ``out``."""
    records = [json.loads(Path(p).read_text()) for p in paths]
    result = {"pooled": paths, "commits": sorted({r["commit"] for r in records}), "shape": shape,
              "ratios": pooled(records, shape)}
    for kind, r in result["ratios"].items():
        if r:
            print(summary_line(shape, kind, r))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--shapes", default="short,long")
    ap.add_argument("--repeats", type=int, default=1, help="rounds of HF then vLLM per shape")
    ap.add_argument("--same-lengths", default=SAME_LENGTHS_SHAPES,
                    help="shapes (comma list, or none) whose rounds also run vLLM at HF's per-row lengths")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "sampling_vs_vllm.json"))
    ap.add_argument("--pool", nargs="+", metavar="JSON",
                    help="measure nothing: the ratios of --shapes (one) over these files' rounds, with intervals")
    args = ap.parse_args()
    if args.pool:
        if "," in args.shapes or args.shapes not in SHAPES:
            ap.error(f"--pool takes one shape in --shapes: pick from {', '.join(SHAPES)}")
        return pool_main(args.pool, args.shapes, args.out)
    shapes = [s for s in args.shapes.split(",") if s]
    same_lengths = {s for s in args.same_lengths.split(",") if s and s != "none"}
    unknown = sorted(set(shapes) - set(SHAPES)) + sorted(same_lengths - set(SHAPES))
    if unknown:
        ap.error(f"unknown shape(s) {', '.join(unknown)}: pick from {', '.join(SHAPES)}")
    if not vllm_importable(args.vllm_python):
        raise SystemExit(f"{args.vllm_python} cannot import vllm and rredcot_cli: pass --vllm-python "
                         "(an interpreter of the vLLM lane's venv, README 'vLLM on CPU')")
    python = {"hf": sys.executable, "vllm": args.vllm_python}
    env = {**THREAD_ENV, "PYTHONPATH": str(ROOT)}  # this checkout's rredcot_cli in the vLLM venv too
    record = {"measured": dt.datetime.now().isoformat(timespec="seconds"), "commit": commit(),
              "machine": machine(), "model": MODEL_PATH, "seed": 0, "threads": 1, "nproc": os.cpu_count(),
              "shapes": {k: [b, *a] for k, (b, a) in SHAPES.items()}, "same_lengths_shapes": sorted(same_lengths),
              "runs": [], "ratios": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def measure(shape: str, round_: int, backend: str, extra: list[str]) -> dict:
        load_before = Path("/proc/loadavg").read_text().strip()
        result = run_decode(backend, python[backend], SHAPES[shape][0], False, SHAPES[shape][1] + extra, env)
        record["runs"].append({"shape": shape, "round": round_, "loadavg_before": load_before,
                               "loadavg_after": Path("/proc/loadavg").read_text().strip(), **result})
        out.write_text(json.dumps(record, indent=2) + "\n")  # kept as it goes: a stopped run loses one call
        return result

    for shape in shapes:
        for round_ in range(args.repeats):
            run_round(lambda backend, extra: measure(shape, round_, backend, extra), shape in same_lengths)
        record["ratios"][shape] = pooled([record], shape)
        out.write_text(json.dumps(record, indent=2) + "\n")
        for kind, r in record["ratios"][shape].items():
            if r:
                print(summary_line(shape, kind, r), flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
