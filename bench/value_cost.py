"""What RREDCoT's value estimation costs next to sampling, and where its credit lands.

On one saved batch per chain length (the embedded tiny model on the synthetic chain task):
  - wall time and generated tokens of sampling the batch (the `sample` stage's work),
  - wall time and forward tokens of `attribute method=rredcot` for each value estimator,
  - how often the most negative segment credit of an incorrect completion contains its first
    wrong step (chance level: 1 / number of segments, averaged), per estimator.

    python bench/value_cost.py --out results/rredcot-value-cost/value_cost.json

Everything runs in one process with fixed seeds; timings are medians over --repeats runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.report.judge import first_error_hits
from rredcot_cli.methods import get_method
from rredcot_cli.methods.rredcot import RREDCoTParams
from rredcot_cli.policy.load import load_policy
from rredcot_cli.pipeline import attribute, credit_batch, sample_rows, segment_rows
from rredcot_cli.config.schema import BackendConfig, ModelConfig, SegmentConfig

# suffix_is windows in tokens, as docs/studies/rredcot-value-cost.md measured them (16 tokens was the
# default then; the default is now one segment).
TOKENS_16 = {"is_window": 16, "is_window_unit": "tokens"}
ESTIMATORS = {
    "answer_probe": {"value": "answer_probe"},  # auto = packed
    "answer_probe_kv": {"value": "answer_probe", "probe_scoring": "kv_cache"},
    "suffix_is": {"value": "suffix_is", **TOKENS_16},
    "suffix_is_packed": {"value": "suffix_is", "probe_scoring": "packed", **TOKENS_16},
    # Plain IS scores every slot (self-normalised IS skips slots whose suffixes all share one
    # reward, e.g. every slot at 40-80 steps where the model never succeeds): the cost of the
    # probes themselves, for the scaling rows.
    "suffix_is_plain": {"value": "suffix_is", "is_self_normalised": False, **TOKENS_16},
    "suffix_is_w8": {"value": "suffix_is", "is_window": 8, "is_window_unit": "tokens"},
    "suffix_is_w4": {"value": "suffix_is", "is_window": 4, "is_window_unit": "tokens"},
}


def run(steps: int, segment_rule: str, segment_kwargs: dict, prompts: int, n: int, max_new_tokens: int,
        repeats: int, seed: int, policy, results: list, estimators: dict = ESTIMATORS) -> None:
    benchmark = make_benchmark("chain", min_steps=steps, max_steps=steps, data_seed=1234)
    problems = benchmark.load("test", limit=prompts)
    by_id = {p.prompt_id: p for p in problems}
    sample_times = []
    for r in range(repeats):
        started = time.perf_counter()
        samples = sample_rows(policy, benchmark, problems, n=n, max_new_tokens=max_new_tokens, temperature=1.0,
                              top_p=1.0, seed=seed, prompts_per_call=max(1, 64 // n))
        sample_times.append(time.perf_counter() - started)
    generated = sum(s["num_tokens"] for s in samples)
    segments = segment_rows(samples, policy.tokenizer, SegmentConfig(name=segment_rule, **segment_kwargs))
    spec = get_method("rredcot")
    row_base = {"steps": steps, "segment": segment_rule, "completions": len(samples),
                "mean_tokens": generated / len(samples), "accuracy": sum(s["reward"] for s in samples) / len(samples),
                "segments_per_completion": len(segments) / len(samples),
                "sample_seconds": statistics.median(sample_times), "generated_tokens": generated}
    for name, overrides in estimators.items():
        params = {**RREDCoTParams().__dict__, **overrides}
        times = []
        for r in range(repeats):
            batch = credit_batch(samples, segments, answer_probe=benchmark.ANSWER_PROBE)
            started = time.perf_counter()
            credit = attribute(spec, batch, params, {"policy": policy})
            times.append(time.perf_counter() - started)
        hits, total, chance = first_error_hits(samples, credit.segment_credits, batch, benchmark,
                                               [by_id[s["prompt_id"]] for s in samples], policy.tokenizer)
        row = {**row_base, "estimator": name, "attribute_seconds": statistics.median(times),
               "forward_tokens": batch.extras["value_stats"].get("forward_tokens", 0),
               "overhead_vs_sampling": statistics.median(times) / row_base["sample_seconds"],
               "incorrect_with_known_error": total, "first_error_hits": hits,
               "first_error_rate": hits / total if total else None, "chance_rate": chance / total if total else None}
        results.append(row)
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench/rredcot-value-cost/value_cost.json")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the CLI's default is 1)")
    parser.add_argument("--cases", default="8,16,80,fixed40,fixed80",
                        help="comma list: N = N-step chains with newline segments, fixedN = fixed 24-token segments")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS), help="comma list of: " + ", ".join(ESTIMATORS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = load_policy(ModelConfig(path=args.model, chat_template=False), BackendConfig(device="cpu"), seed=args.seed)
    results: list[dict] = []
    # Default settings (newline segments, at most 40) at short, medium and long chains; the model
    # solves 16-step chains a third of the time and 80-step ones never (no credit to localise).
    cases = args.cases.split(",")
    estimators = {name: ESTIMATORS[name] for name in args.estimators.split(",")}
    for steps, max_new in [(8, 128), (16, 160), (80, 640)]:
        if str(steps) in cases:
            run(steps, "newline", {"tokens": 32, "min_tokens": 4, "max_segments": 40}, args.prompts, args.n, max_new,
                args.repeats, args.seed, policy, results, estimators)
    # Fixed segment density (one segment per 24 tokens, no cap): does cost double with length?
    for steps, max_new in [(40, 400), (80, 640)]:
        if f"fixed{steps}" in cases:
            run(steps, "fixed", {"tokens": 24, "min_tokens": 1, "max_segments": 10_000}, args.prompts, args.n,
                max_new, args.repeats, args.seed, policy, results, estimators)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
               "threads": torch.get_num_threads()}
    out.write_text(json.dumps({"args": vars(args), "machine": machine, "results": results}, indent=2))
    out.with_suffix(".md").write_text(markdown_table(results))
    print(f"wrote {out} and {out.with_suffix('.md')}")


def markdown_table(results: list[dict]) -> str:
    header = ("| steps | segments | tokens/completion | segments/completion | estimator | sample s | attribute s "
              "| attribute / sample | forward tokens | generated tokens | first-error hits | chance |\n")
    header += "|" + "---|" * 12 + "\n"
    lines = []
    for r in results:
        rate = "n/a" if r["first_error_rate"] is None else f"{r['first_error_hits']}/{r['incorrect_with_known_error']} = {r['first_error_rate']:.2f}"
        chance = "n/a" if r["chance_rate"] is None else f"{r['chance_rate']:.2f}"
        lines.append(f"| {r['steps']} | {r['segment']} | {r['mean_tokens']:.0f} | {r['segments_per_completion']:.1f} | "
                     f"{r['estimator']} | {r['sample_seconds']:.2f} | {r['attribute_seconds']:.2f} | "
                     f"{r['overhead_vs_sampling']:.2f} | {r['forward_tokens']} | {r['generated_tokens']} | {rate} | {chance} |")
    return header + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
