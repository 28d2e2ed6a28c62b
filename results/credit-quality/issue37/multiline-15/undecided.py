"""Exploratory, not in PLAN.md (written after its results were seen): the 15 batches' inner
boundaries split into those the verifier has decided (the closed Answer: line is in the prefix: the
rule puts the grade there, which the MC reference and the outcome copy also hold) and the undecided
ones before it, where only the estimator's own evidence speaks. Same traces, kept MC references,
parameters and seeds as the judges; per batch value ρ and MSE on each subset, and paired differences
estimator - control over the batches with 95% t intervals. Run from the repository root:

    python results/credit-quality/issue37/multiline-15/undecided.py > results/credit-quality/issue37/multiline-15/undecided.md
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from rredcot_cli.config.compose import compose
from rredcot_cli.metrics import mean_ci
from rredcot_cli.methods import get_method
from rredcot_cli.pipeline import attribute, credit_batch
from rredcot_cli.report.judge import control_values, finite_pairs, segment_exists, spearman
from rredcot_cli.rng import derive_seed, seed_everything
from rredcot_cli.stages.common import make_benchmark, make_collaborators, make_policy, read_segmented_samples
from rredcot_cli.stages.judge import method_params, read_reference, reference_rows, seeded

HERE = Path(__file__).parent
BATCHES = [(f"runs/jd-b{b}", 1) for b in range(1, 6)] + [(f"runs/jd2-b{b}", 2) for b in range(1, 11)]
MODEL = ["model=smollm2-135m-instruct", "model.chat_template=false", "benchmark=arith_multiline",
         "sampling.max_new_tokens=96", "judge.batches=1", "judge.reference_k=8", "judge.reruns=1"]
ESTIMATORS = ("answer_probe", "suffix_is", "answer_share")


def measures(values, reference, mask):
    v, r = finite_pairs(values, reference, mask)
    return {"rho": spearman(v, r), "mse": float(((v - r) ** 2).mean()) if v.numel() else None, "n": int(v.numel())}


def main() -> None:
    rows = []  # (batch, subset, row name) -> measures
    policy = None
    for index, (run_dir, seed) in enumerate(BATCHES):
        cfg = compose([f"run.dir={run_dir}", f"seed={seed}", *MODEL])
        inputs = {"samples": Path(run_dir) / "sample" / "samples.parquet",
                  "segments": Path(run_dir) / "segment" / "segments.parquet"}
        samples, segments = read_segmented_samples(inputs)
        seed_everything(cfg.seed)
        benchmark = make_benchmark(cfg)
        policy = policy or make_policy(cfg)
        batch = credit_batch(samples, segments, answer_probe=benchmark.ANSWER_PROBE, benchmark=benchmark)
        cached = read_reference(next((Path(run_dir) / "mc-reference").glob("*.parquet")))
        reference = reference_rows(cached["values"], samples, batch.num_segments, Path(run_dir))[:, 1:]
        S = reference.shape[1]
        inner = segment_exists(batch.num_segments, S) & (torch.arange(S)[None, :] < batch.num_segments[:, None] - 1)
        decided = ~torch.isnan(batch.extras["decided_values"][:, :S])
        subsets = {"inner": inner, "decided": inner & decided, "undecided": inner & ~decided}
        named = {}
        spec = get_method("rredcot")
        for value in ESTIMATORS:
            params = method_params("rredcot", {"value": value}, cfg.model)
            rerun_seed = derive_seed(cfg.seed, "judge", "rerun", 0)
            seed_everything(rerun_seed)
            fresh = credit_batch(samples, segments, answer_probe=benchmark.ANSWER_PROBE, benchmark=benchmark)
            credit = attribute(spec, fresh, seeded(params, rerun_seed), make_collaborators(cfg, spec, policy))
            named[value] = credit.segment_values
        for kind in ("outcome", "baseline"):
            named[f"control:{kind}"] = control_values(kind, batch.rewards, batch.group_ids, batch.num_segments)[0]
        for name, values in named.items():
            for subset, mask in subsets.items():
                rows.append({"batch": index + 1, "subset": subset, "row": name, **measures(values, reference, mask)})
    (HERE / "undecided.json").write_text(json.dumps(rows, indent=1) + "\n")

    def ci(xs):
        xs = [x for x in xs if x is not None and not math.isnan(x)]
        if len(xs) < 2:
            return "—"
        m, lo, hi = mean_ci(xs)
        return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] ({len(xs)})"

    get = {(r["batch"], r["subset"], r["row"]): r for r in rows}
    batches = range(1, len(BATCHES) + 1)
    print("| subset | boundaries | row | value ρ | value MSE |")
    print("|---|---|---|---|---|")
    for subset in ("inner", "decided", "undecided"):
        n = sum(get[(b, subset, "control:outcome")]["n"] for b in batches)
        for name in (*ESTIMATORS, "control:outcome", "control:baseline"):
            print(f"| {subset} | {n} | {name} | {ci([get[(b, subset, name)]['rho'] for b in batches])} | "
                  f"{ci([get[(b, subset, name)]['mse'] for b in batches])} |")
    print()
    print("Paired differences estimator - control over the batches where both are defined (95% t):")
    print()
    print("| subset | estimator | control | Δ value ρ | Δ value MSE |")
    print("|---|---|---|---|---|")
    for subset in ("inner", "undecided"):
        for name in ESTIMATORS:
            for control in ("control:outcome", "control:baseline"):
                def diff(key):
                    pairs = [(get[(b, subset, name)][key], get[(b, subset, control)][key]) for b in batches]
                    return [a - c for a, c in pairs if a is not None and c is not None]
                print(f"| {subset} | {name} | {control} | {ci(diff('rho'))} | {ci(diff('mse'))} |")


if __name__ == "__main__":
    main()
