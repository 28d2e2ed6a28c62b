"""RREDCoT's step against GRPO's on the same ~1k-token batch with a mixed group, measured (issue 42 item 3).

    python bench/long_step_pair.py --work /tmp/pair --out results/real-model-speed/long_step_pair.json   # ~20 min quiet

The long-chain profile (bench/real_model.py --shape long) had no mixed group at either seed on
GSM8K, so GRPO's update never ran there and RREDCoT's / GRPO's step was only estimated. This shape
has one at seed 0: SmolLM2-135M-Instruct on ``arith`` asked to explain its reasoning step by step
(bench/real_model_memory.sh's long shape: 4 prompts x 4 samples, up to 1,024 new tokens, one step;
one of its 16 completions is correct, so one group is mixed and GRPO's update runs its passes).
GRPO, then RREDCoT with the model's default value estimator (answer_probe), one ``rredcot train``
process each (one torch thread, ``/usr/bin/time -v`` for peak RSS), seed 0, so step 1 samples the
same completions under both (their sha256 is compared: equal = the same batch). Per run: the step's
seconds and its phases (``train/metrics.parquet``), CPU seconds and the CPU other processes used
meanwhile (``others_cores``; above ~0.15 a busy machine's figure). The ratio is RREDCoT's step
seconds over GRPO's (goal <= 1.2x; the paper reports 1.5-2x). A timing profile, not an accuracy claim.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq

from measure import commit, machine, run_watched
from real_model import MODEL, THREAD_ENV, rollout_groups

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.2
SHAPE = [f"model={MODEL}", "benchmark=arith", "train.prompts_per_step=4", "sampling.n=4",
         "sampling.max_new_tokens=1024", "train.steps=1", "train.eval_every=0", "train.eval_problems=2",
         "train.eval_samples=1", "train.save_every=0", "train.save_rollouts=1", "seed=0", "backend.num_threads=1",
         "run.overwrite=true",
         "benchmark.prompt_template='{question} Explain your reasoning step by step in detail, then give the final answer.'"]


def run_step(method: str, work: Path) -> dict:
    """One 1-step ``rredcot train`` of ``method`` at SHAPE; its step's seconds, phases and samples."""
    run_dir = work / method
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "rredcot_cli", "train", f"method={method}", *SHAPE,
           f"run.dir={run_dir}"]
    proc, info, _ = run_watched(cmd, THREAD_ENV, method)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    row = {"method": method, **info, "peak_rss_gib": int(peak.group(1)) / 2**20 if peak else None}
    if proc.returncode:
        return row
    step = pq.read_table(run_dir / "train" / "metrics.parquet").to_pylist()[0]
    row["step_s"] = step["seconds"]
    row["phases"] = {k[len("seconds_"):]: v for k, v in step.items() if k.startswith("seconds_")}
    row["credit_forward_tokens"] = step.get("credit_forward_tokens")
    row["groups"] = rollout_groups(run_dir / "train" / "rollouts" / "step-000001")
    print(f"  {method}: step {row['step_s']:.1f} s, " + ", ".join(f"{k} {v:.1f}" for k, v in row["phases"].items() if v)
          + f"; others' cores {info['others_cores_mean']}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="folder for the two runs")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "long_step_pair.json"))
    args = ap.parse_args()
    work = Path(args.work).resolve()
    record = {"measured": dt.datetime.now().isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
              "nproc": os.cpu_count(), "shape": SHAPE, "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for method in ("grpo", "rredcot"):
        record["runs"].append(run_step(method, work))
        out.write_text(json.dumps(record, indent=2) + "\n")
    grpo, rredcot = record["runs"]
    if "step_s" in grpo and "step_s" in rredcot:
        ratio = rredcot["step_s"] / grpo["step_s"]
        same = grpo["groups"]["completions_sha256"] == rredcot["groups"]["completions_sha256"]
        record["result"] = {"rredcot_over_grpo_step": ratio, "goal": GOAL, "met": ratio <= GOAL,
                            "same_samples": same, "mixed_groups": grpo["groups"]["mixed_groups"],
                            "grpo_update_ran": bool(grpo["groups"]["mixed_groups"])}
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"RREDCoT / GRPO step = {ratio:.2f}x (goal <= {GOAL}x); same samples: {same}; mixed groups: "
              f"{grpo['groups']['mixed_groups'] or 'none (GRPO skipped its update: the ratio is not the goal’s)'}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
