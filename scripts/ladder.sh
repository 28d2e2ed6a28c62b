#!/usr/bin/env bash
# The length ladder's headroom table (docs/long-chains.md): sampled pass@1 (8 samples at T=1)
# and greedy accuracy of each model on each rung, with the completion length, via `rredcot eval`.
#
#   scripts/ladder.sh                                          # the shipped tiny-chain, vLLM on the CPU
#   LONG=runs/tiny-chain-long/sft/model scripts/ladder.sh      # and a long-chain model
#   BACKEND=hf PROBLEMS=16 scripts/ladder.sh                   # a quick look with the HF backend
#
# Rungs: R1 and R2 are the plain `chain` task with the shipped tiny-chain (also measured on long
# plain chains: its length cliff). R3 and R4 are LONG_BENCHMARK (default chain) at R3_STEPS and
# R4_STEPS with the long-chain model LONG, plus shorter and longer lengths for its accuracy by
# length. No long-chain model is shipped yet: three recipes failed (docs/long-chains.md).
#
# Environment:
#   LONG      the long-chain model (a folder or a shipped model's name); its rungs are skipped if absent
#   LONG_BENCHMARK, R3_STEPS, R4_STEPS   its task and rung lengths (default chain, "40 60", "80 90")
#   BACKEND   vllm (default; the CPU build samples long chains ~6x faster than HF) or hf
#   PROBLEMS  test problems per rung (default 64)
#   RUNS      where the eval run dirs go (default runs/ladder); OUT the JSON summary (default
#             docs/bench/ladder.json)
# A finished eval (same config) is skipped by `rredcot eval` itself, so the script can be rerun.
set -euo pipefail

PYTHON=${PYTHON:-python}
LONG=${LONG:-runs/tiny-chain-long/sft/model}
LONG_BENCHMARK=${LONG_BENCHMARK:-chain}
R3_STEPS=${R3_STEPS:-40 60}
R4_STEPS=${R4_STEPS:-80 90}
BACKEND=${BACKEND:-vllm}
PROBLEMS=${PROBLEMS:-64}
RUNS=${RUNS:-runs/ladder}
OUT=${OUT:-docs/bench/ladder.json}
PER_STEP_TOKENS=${PER_STEP_TOKENS:-8}  # generation budget per chain step (a `chain` line is ~6 tokens)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# model  tag  benchmark  rung  min_steps  max_steps
LADDER=(
  "embedded tiny-chain chain R1 4 12"
  "embedded tiny-chain chain R2 14 20"
  "embedded tiny-chain chain plain-40-60 40 60"
  "$LONG tiny-chain-long $LONG_BENCHMARK short-4-12 4 12"
  "$LONG tiny-chain-long $LONG_BENCHMARK R3 $R3_STEPS"
  "$LONG tiny-chain-long $LONG_BENCHMARK R4 $R4_STEPS"
)
have_long=$($PYTHON -c "import sys; from pathlib import Path; from rredcot_cli.models import resolve_model_path; \
print(int(Path(resolve_model_path(sys.argv[1]), 'config.json').is_file()))" "$LONG")
started=$SECONDS
for entry in "${LADDER[@]}"; do
  read -r model tag benchmark rung lo hi <<<"$entry"
  if [[ "$tag" == tiny-chain-long && "$have_long" != 1 ]]; then
    echo "ladder: no model at LONG=$LONG; skipping $rung"
    continue
  fi
  budget=$((PER_STEP_TOKENS * hi + 64))  # the answer line and slack
  common=(model.path="$model" backend="$BACKEND" benchmark="$benchmark" benchmark.min_steps="$lo"
          benchmark.max_steps="$hi" sampling.max_new_tokens="$budget" eval.num_problems="$PROBLEMS" seed=0)
  $PYTHON -m rredcot_cli eval run.dir="$RUNS/$tag/$rung-sampled" "${common[@]}" eval.n=8 "eval.k=[1,8]"
  $PYTHON -m rredcot_cli eval run.dir="$RUNS/$tag/$rung-greedy" "${common[@]}" eval.n=1 "eval.k=[1]" eval.temperature=0
done
echo "ladder: $((SECONDS - started)) s"

$PYTHON - "$RUNS" "$OUT" <<'PY'
import json, platform, sys
from pathlib import Path
runs, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for metrics in sorted(runs.glob("*/*/eval/metrics.json")):
    m = json.loads(metrics.read_text())
    model = metrics.parents[2].name
    rung, mode = metrics.parents[1].name.rsplit("-", 1)
    config = (metrics.parent / "config.yaml").read_text()
    rows.append({"model": model, "rung": rung, "mode": mode, "pass@1": m["pass@1"], "pass@8": m.get("pass@8"),
                 "mean_tokens": m["mean_tokens"], "problems": m["num_problems"], "seconds": m.get("seconds"),
                 "config": config})
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"machine": platform.platform(), "rows": rows}, indent=2) + "\n")
print(f"{'model':<16}{'rung':<15}{'mode':<9}{'pass@1':>8}{'tokens':>8}")
for r in rows:
    print(f"{r['model']:<16}{r['rung']:<15}{r['mode']:<9}{r['pass@1']:>8.3f}{r['mean_tokens']:>8.0f}")
PY
