"""The answer_probe value pass (RREDCoT's credit phase) on real ~1k-token chains, before and after a
change to the probe scorer, beside the pass's forward bound (issue 42 item 3).

    python bench/long_credit.py --before main --out results/real-model-speed/long-credit/long_credit.json
    python bench/long_credit.py --before main --repeats 1 --cases all_wrong --kv-cache   # + the KV-cache scorer
    python bench/long_credit.py --before main --short --repeats 5 --out results/real-model-speed/long-credit/short_chains.json
    python bench/long_credit.py --before main --reference 16 --out results/real-model-speed/long-credit/reference.json

The traces: 16 saved completions of SmolLM2-135M-Instruct (``results/real-model-speed/long-credit/traces``:
step 1 of the long-chain profile's ``rredcot-hf-seed1`` run, GSM8K test prompts 0 and 1 x 8, up to
1,024 new tokens, 4 truncated; the same samples as docs/studies/real-model-speed.md's "Long chains"
tables, sha256 in the manifests), so every run scores the same probes. Cases:

- ``all_wrong``: the batch as sampled (0/8 correct in both groups): D = the gold answer alone.
- ``mixed``: a timing device, not a sample: sample 0 of ``gsm8k/test/1`` is marked correct
  (reward 1, its answer set to the gold answer), so group 1 is a mixed group as the goal's step
  needs one. Its candidate set is then what a mixed group has: the gold, plus the correct member's
  answer for the other seven, and the same gold string for all of them here, so the probes merge to
  those of ``all_wrong`` and the two cases differ only in the rewards the value pass never reads.

Each measurement is its own process (``--driver``): it loads the model as the train stage does
(fp32, one torch thread), builds the credit batch as the train loop does (``pipeline.credit_batch``
with the benchmark's forced-answer template), and times the answer_probe estimator over the step's
inner segment boundaries (the method's default ``baseline=group_mean``), CPU seconds
(``time.process_time``) and wall, with the CPU other processes used meanwhile (``LoadWatcher``).
``before`` runs the ``rredcot_cli`` of git revision ``--before`` (``git archive`` into a temporary
folder, first on ``PYTHONPATH``); ``after`` runs this checkout's. Runs are interleaved (before,
after, before, after, ...) so both arms see the same machine load on average. Forward positions are
the scorer's own count (``value_stats["forward_tokens"]``); the bound is bench/real_model.py's
(``value_pass_work``: the positions the probes need at least once, at torch.mm's measured fp32 rate
on this machine, measured once at the start). The values of each run are compared with the
``before`` arm's first run of the same case: the max abs difference says whether the change moved
them beyond float rounding.

``--short``: the other end, that the change costs nothing where the packed scorer was chosen
(docs/studies/rredcot-value-cost.md): bench/value_cost.py's chain batches on the embedded model
(8 prompts x 8 samples of 8-, 16- and 80-step chains, newline segments, seed 0), the answer_probe
values with ``--before``'s ``values/packing.py`` (loaded from git as its own module; the rest of the
package is this checkout's) and with this checkout's, interleaved in one process, ``--repeats``
times each, CPU seconds (medians) and forward positions.

``--reference K``: how far the packed scorers' log-probs are from scoring each prefix from scratch
(``unpacked_probe_logprobs``, the tests' reference) on the real long traces: both arms' scorers on
all of ``all_wrong``'s probes in one process, the reference on every K-th probe (from scratch costs
prefix x probes), max abs difference of the probes' summed log-probs (log V of a one-candidate set).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

# a driver process imports the rredcot_cli that its PYTHONPATH names: the before arm's archive
import rredcot_cli
from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.config.schema import BackendConfig, ModelConfig, SegmentConfig
from rredcot_cli.methods.rredcot import segment_ends
from rredcot_cli.pipeline import credit_batch, sample_rows, segment_rows
from rredcot_cli.policy.load import load_policy
from rredcot_cli.values import packing
from rredcot_cli.values.answer_probe import _candidates, _prefix_lens, _probes, _traces, answer_probe_values
from rredcot_cli.values.packing import value_stats
from rredcot_cli.values.registry import ValueSettings, get_value_estimator
from measure import LoadWatcher, busy, commit, git, machine
from real_model import MODEL_PATH, THREAD_ENV, matmul_rates, model_shapes, value_pass_bound, value_pass_work

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRACES = ROOT / "results" / "real-model-speed" / "long-credit" / "traces"
CASES = ("all_wrong", "mixed")
MIXED_SAMPLE = ("gsm8k/test/1", 0)  # marked correct in the mixed case


def mixed_step(traces: Path, into: Path) -> Path:
    """A copy of the saved step with ``MIXED_SAMPLE`` marked correct with its gold answer."""
    rows = pq.read_table(traces / "sample" / "samples.parquet")
    samples = rows.to_pylist()
    for row in samples:
        if (row["prompt_id"], row["sample_idx"]) == MIXED_SAMPLE:
            row["reward"], row["pred_answer"] = 1.0, row["gold_answer"]
    (into / "sample").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(samples, schema=rows.schema), into / "sample" / "samples.parquet")
    shutil.copytree(traces / "segment", into / "segment", dirs_exist_ok=True)
    return into


# =========================================================================== one measurement (own process)


def driver(step_dir: Path, probe_scoring: str, values_out: Path) -> None:
    """Time the answer_probe value pass on the saved step once; print one JSON line."""
    torch.set_num_threads(1)
    policy = load_policy(ModelConfig(path=MODEL_PATH, chat_template="auto"), BackendConfig(device="cpu"), seed=0)
    samples = pq.read_table(step_dir / "sample" / "samples.parquet").to_pylist()
    segments = pq.read_table(step_dir / "segment" / "segments.parquet").to_pylist()
    benchmark = make_benchmark(samples[0]["benchmark"])
    batch = credit_batch(samples, segments, answer_probe=benchmark.ANSWER_PROBE, benchmark=benchmark)
    offsets = [ends[:-1] for ends in segment_ends(batch)]  # baseline=group_mean: the inner boundaries
    estimator = get_value_estimator("answer_probe")
    settings = ValueSettings(probe_scoring=probe_scoring)
    with LoadWatcher(period=1.0) as watcher:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        values = estimator.fn(batch, policy, offsets, settings)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    values_out.write_text(json.dumps([v.tolist() for v in values]))
    print(json.dumps({"cpu_s": cpu_s, "wall_s": wall_s, "forward_tokens": value_stats(batch).get("forward_tokens"),
                      "boundaries": sum(map(len, offsets)), "rredcot_cli": str(Path(rredcot_cli.__file__).parent),
                      **watcher.others_cores()}))


# =========================================================================== the comparison


def archive(revision: str, into: Path) -> str:
    """``rredcot_cli`` of git ``revision`` unpacked into ``into``; returns the full commit id."""
    full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", revision], check=True, capture_output=True,
                          text=True).stdout.strip()
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", full, "rredcot_cli"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    return full


def measure(step_dir: Path, probe_scoring: str, code: Path | None, values_out: Path) -> dict:
    """One ``--driver`` process on ``code``'s rredcot_cli (None: this checkout's)."""
    env = {**os.environ, **THREAD_ENV}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, str(Path(__file__).resolve()), "--driver", "--step", str(step_dir),
               "--probe-scoring", probe_scoring, "--values-out", str(values_out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"driver failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max((abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)), default=0.0)


def max_rel_diff(a: list[list[float]], b: list[list[float]]) -> float:
    """Relative to ``b``: the values are probabilities, many far below the absolute difference's scale."""
    return max((abs(x - y) / abs(y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if y), default=0.0)


def summarize(runs: list[dict], bounds: dict) -> list[dict]:
    """Per (case, arm): medians of the runs, against the case's forward bound."""
    out = []
    for case, arm in dict.fromkeys((r["case"], r["arm"]) for r in runs):
        mine = [r for r in runs if r["case"] == case and r["arm"] == arm]
        cpu, wall = statistics.median(r["cpu_s"] for r in mine), statistics.median(r["wall_s"] for r in mine)
        bound = bounds[case]
        out.append({"case": case, "arm": arm, "runs": len(mine), "cpu_s": cpu, "wall_s": wall,
                    "forward_tokens": mine[0]["forward_tokens"], "positions_bound": bound["positions_bound"],
                    "bound_s": bound["bound_s"], "cpu_over_bound": cpu / bound["bound_s"],
                    "wall_over_bound": wall / bound["bound_s"],
                    "values_max_abs_diff_vs_before": max(r["values_max_abs_diff_vs_before"] for r in mine),
                    "values_max_rel_diff_vs_before": max(r["values_max_rel_diff_vs_before"] for r in mine),
                    "others_cores_mean": statistics.fmean(r["others_cores_mean"] for r in mine)})
    return out


def markdown(summary: list[dict]) -> str:
    lines = ["| case | arm | runs | CPU s | wall s | forward positions | bound positions | bound s | CPU / bound "
             "| wall / bound | value diff vs before: max abs / max rel | load (others' cores) |", "|" + "---|" * 12]
    for s in summary:
        lines.append(f"| {s['case']} | {s['arm']} | {s['runs']} | {s['cpu_s']:.1f} | {s['wall_s']:.1f} | "
                     f"{s['forward_tokens']:,} | {s['positions_bound']:,} | {s['bound_s']:.1f} | "
                     f"{s['cpu_over_bound']:.2f}x | {s['wall_over_bound']:.2f}x | {s['values_max_abs_diff_vs_before']:.1e} / {s['values_max_rel_diff_vs_before']:.1e} | "
                     f"{busy(s['others_cores_mean'])} ({s['others_cores_mean']:.2f}) |")
    return "\n".join(lines) + "\n"


def compare(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    shapes = model_shapes(MODEL_PATH)
    rates = matmul_rates(shapes)
    print(f"matmul: {rates['body_gflops']:.1f} GFLOP/s body, {rates['head_gflops']:.1f} head "
          f"({busy(rates['others_cores_mean'])}, others {rates['others_cores_mean']:.2f})", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "before").mkdir()
        before_commit = archive(args.before, tmp / "before")
        steps = {"all_wrong": args.traces, "mixed": mixed_step(args.traces, tmp / "mixed")}
        bounds = {}
        for case in args.cases:
            work = value_pass_work(steps[case], MODEL_PATH, shapes)
            # real_model's own formula: a step whose credit phase took 0 s, for its bound alone
            bound = value_pass_bound({"value_pass": work, "phases": {"credit": 0.0}}, rates)
            bounds[case] = {**work, "bound_s": bound["bound_s"], "positions_bound": bound["positions_bound"]}
        arms = [("before", "auto", tmp / "before"), ("after", "auto", None)]
        arms += [("after-kv_cache", "kv_cache", None)] if args.kv_cache else []
        runs, first_values = [], {}
        for repeat in range(args.repeats):
            for case in args.cases:
                for arm, scoring, code in arms:
                    values_out = tmp / f"values-{case}-{arm}-{repeat}.json"
                    row = {"case": case, "arm": arm, "repeat": repeat, "probe_scoring": scoring,
                           **measure(steps[case], scoring, code, values_out)}
                    values = json.loads(values_out.read_text())
                    first_values.setdefault(case, values)  # the before arm runs first
                    row["values_max_abs_diff_vs_before"] = max_abs_diff(values, first_values[case])
                    row["values_max_rel_diff_vs_before"] = max_rel_diff(values, first_values[case])
                    row["values_range"] = [min(map(min, filter(None, values))), max(map(max, filter(None, values)))]
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    summary = summarize(runs, bounds)
    data = {"command": " ".join(sys.argv), "commit": commit(), "dirty": bool(git("status", "--porcelain")), "before_commit": before_commit, "machine": machine(),
            "model_path": MODEL_PATH, "traces": str(args.traces.relative_to(ROOT)), "shapes": shapes, "matmul": rates,
            "bounds": bounds, "runs": runs, "summary": summary, "total_wall_s": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2))
    args.out.with_suffix(".md").write_text(markdown(summary))
    print(markdown(summary))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


def module_at(revision: str, path: str, name: str, into: Path):
    """``path`` as it is at git ``revision``, imported as module ``name``."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], check=True, capture_output=True).stdout
    (into / f"{name}.py").write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, into / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while they are built
    spec.loader.exec_module(module)
    return module


def short_chains(args: argparse.Namespace) -> None:
    """``--short`` (module docstring): before and after on short traces of the embedded model."""
    torch.set_num_threads(1)
    policy = load_policy(ModelConfig(path="embedded", chat_template=False), BackendConfig(device="cpu"), seed=0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        before = module_at(args.before, "rredcot_cli/values/packing.py", "packing_before", Path(tmp))
        arms = {"before": before.packed_probe_logprobs, "after": packing.packed_probe_logprobs}
        for steps, max_new in [(8, 128), (16, 160), (80, 640)]:  # bench/value_cost.py's newline cases
            benchmark = make_benchmark("chain", min_steps=steps, max_steps=steps, data_seed=1234)
            samples = sample_rows(policy, benchmark, benchmark.load("test", limit=8), n=8, max_new_tokens=max_new,
                                  temperature=1.0, top_p=1.0, seed=0, prompts_per_call=8)
            segments = segment_rows(samples, policy.tokenizer,
                                    SegmentConfig(name="newline", tokens=32, min_tokens=4, max_segments=40))
            batch = credit_batch(samples, segments, answer_probe=benchmark.ANSWER_PROBE)
            offsets = [ends[:-1] for ends in segment_ends(batch)]
            inputs = (policy.model, _traces(batch), _prefix_lens(batch, offsets),
                      _candidates(batch, policy.tokenizer, benchmark.ANSWER_PROBE, correct_only=True))
            cpu = {arm: [] for arm in arms}
            positions, values = {}, {}
            with LoadWatcher(period=1.0) as watcher:
                for _ in range(args.repeats):
                    for arm, scorer in arms.items():
                        stats = {}
                        started = time.process_time()
                        values[arm] = [v.tolist() for v in answer_probe_values(*inputs, stats=stats, scorer=scorer)]
                        cpu[arm].append(time.process_time() - started)
                        positions[arm] = stats["forward_tokens"]
            lengths = [len(t) for t in inputs[1]]
            row = {"steps": steps, "traces": len(lengths), "trace_tokens_min": min(lengths),
                   "trace_tokens_max": max(lengths), "trace_tokens_mean": statistics.fmean(lengths),
                   "boundaries": sum(map(len, offsets)), "cpu_s": cpu, "positions": positions,
                   "after_over_before": statistics.median(cpu["after"]) / statistics.median(cpu["before"]),
                   "values_max_abs_diff": max_abs_diff(values["after"], values["before"]), **watcher.others_cores()}
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| chain steps | trace tokens (min-max, mean) | boundaries | before CPU s | after CPU s | after / before "
             "| positions before | positions after | max abs value diff | load (others' cores) |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['steps']} | {r['trace_tokens_min']}-{r['trace_tokens_max']}, {r['trace_tokens_mean']:.0f} | "
                     f"{r['boundaries']} | {statistics.median(r['cpu_s']['before']):.3f} | "
                     f"{statistics.median(r['cpu_s']['after']):.3f} | {r['after_over_before']:.2f}x | "
                     f"{r['positions']['before']:,} | {r['positions']['after']:,} | {r['values_max_abs_diff']:.1e} | "
                     f"{busy(r['others_cores_mean'])} ({r['others_cores_mean']:.2f}) |")
    data = {"command": " ".join(sys.argv), "commit": commit(), "dirty": bool(git("status", "--porcelain")),
            "before": args.before, "machine": machine(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2))
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


def reference_check(args: argparse.Namespace) -> None:
    """``--reference K`` (module docstring)."""
    torch.set_num_threads(1)
    policy = load_policy(ModelConfig(path=MODEL_PATH, chat_template="auto"), BackendConfig(device="cpu"), seed=0)
    samples = pq.read_table(args.traces / "sample" / "samples.parquet").to_pylist()
    segments = pq.read_table(args.traces / "segment" / "segments.parquet").to_pylist()
    benchmark = make_benchmark(samples[0]["benchmark"])
    batch = credit_batch(samples, segments, answer_probe=benchmark.ANSWER_PROBE, benchmark=benchmark)
    offsets = [ends[:-1] for ends in segment_ends(batch)]
    candidates = _candidates(batch, policy.tokenizer, benchmark.ANSWER_PROBE, correct_only=True)
    probes, _ = _probes(_prefix_lens(batch, offsets), candidates)
    traces = _traces(batch)
    with tempfile.TemporaryDirectory() as tmp:
        before = module_at(args.before, "rredcot_cli/values/packing.py", "packing_before", Path(tmp))
        with LoadWatcher(period=1.0) as watcher:
            scored = {"before": before.packed_probe_logprobs(policy.model, traces, probes),
                      "after": packing.packed_probe_logprobs(policy.model, traces, probes)}
            picked = list(range(0, len(probes), args.reference))
            reference = packing.unpacked_probe_logprobs(policy.model, traces, [probes[i] for i in picked])
    sums = {arm: [float(lp.double().sum()) for lp in lps] for arm, lps in scored.items()}
    ref_sums = [float(lp.double().sum()) for lp in reference]
    tokens = {arm: max(float((scored[arm][i] - r).abs().max()) for i, r in zip(picked, reference)) for arm in scored}
    row = {"probes": len(probes), "reference_probes": len(picked),
           "reference_prefix_tokens": [probes[i].prefix_len for i in picked],
           "log_value_max_abs_diff_vs_reference": {arm: max(abs(sums[arm][i] - r) for i, r in zip(picked, ref_sums))
                                                   for arm in scored},
           "token_logprob_max_abs_diff_vs_reference": tokens,
           "log_value_max_abs_diff_after_vs_before": max(abs(a - b) for a, b in zip(sums["after"], sums["before"])),
           **watcher.others_cores()}
    data = {"command": " ".join(sys.argv), "commit": commit(), "dirty": bool(git("status", "--porcelain")),
            "before": args.before, "machine": machine(), **row}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2))
    print(json.dumps(row, indent=2))
    print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="main", help="git revision whose rredcot_cli is the before arm")
    parser.add_argument("--traces", type=Path, default=TRACES, help="a saved step: sample/ and segment/ parquet files")
    parser.add_argument("--cases", type=lambda s: s.split(","), default=list(CASES), help="comma list of: " + ", ".join(CASES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kv-cache", action="store_true", help="also time this checkout's KV-cache scorer")
    parser.add_argument("--short", action="store_true", help="short chains of the embedded model instead (docstring)")
    parser.add_argument("--reference", type=int, metavar="K", help="against scoring every K-th probe from scratch (docstring)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "long_credit.json",
                        help="where the JSON goes; the committed figures take --out results/real-model-speed/long-credit/...")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--probe-scoring", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--values-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.exit(2, f"unknown --cases {', '.join(unknown)}; valid: {', '.join(CASES)}\n")
    if args.driver:
        driver(args.step, args.probe_scoring, args.values_out)
    elif args.short:
        short_chains(args)
    elif args.reference:
        reference_check(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
