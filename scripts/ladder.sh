#!/usr/bin/env bash
# The length ladder's headroom table (docs/studies/long-chains.md, the model cards, the README): sampled
# pass@1 (8 samples at T=1) and greedy accuracy of each model on each rung, with the completion
# length, via `rredcot eval`.
#
#   scripts/ladder.sh                                  # tiny-chain and tiny-chain-verbose, vLLM on the CPU
#   BACKEND=hf PROBLEMS=16 scripts/ladder.sh           # a quick look with the HF backend
#   LONG=runs/x/sft/model LONG_BENCHMARK=chain R3_STEPS="40 60" R4_STEPS="80 90" PER_STEP_TOKENS=8 \
#       scripts/ladder.sh                              # another long-chain model and task
#
# Rungs: R1 and R2 are the plain `chain` task with the shipped tiny-chain (also measured at 40-60
# steps: its length cliff). R3 and R4 are LONG_BENCHMARK (default chain_verbose: the same problems,
# ~70-100 tokens per step) at R3_STEPS and R4_STEPS with the model LONG (default the shipped
# tiny-chain-verbose); R4 at 4-12 steps poses exactly R1's problems. BY_LENGTH adds one row per
# chain length for the LONG model's card (PROBLEMS_PER_LENGTH problems each).
#
# Environment:
#   LONG      the long-chain model (a folder or a shipped model's name, default tiny-chain-verbose); its rungs are skipped if absent
#   LONG_BENCHMARK, R3_STEPS, R4_STEPS   its task and rung lengths (default chain_verbose, "2 5", "4 12")
#   PER_STEP_TOKENS   generation budget per chain step (default 100: a verbose line is ~70-100 tokens)
#   BY_LENGTH         chain lengths for the per-length rows (default "2 4 6 8 10 12 14 16"; "" for none)
#   BACKEND   vllm (default; the CPU build samples long chains ~6x faster than HF) or hf
#   PROBLEMS  test problems per rung (default 64); PROBLEMS_PER_LENGTH (default 32)
#   RUNS      where the eval run dirs go (default runs/ladder); OUT the JSON summary (default
#             $RUNS/ladder.json; the committed one is rewritten only with OUT=results/long-chains/ladder.json)
# A finished eval (same config) is skipped by `rredcot eval` itself, so the script can be rerun.
set -euo pipefail

PYTHON=${PYTHON:-python}
LONG=${LONG:-tiny-chain-verbose}
LONG_TAG=$(basename "$LONG")
[[ "$LONG_TAG" == model ]] && LONG_TAG=$(basename "$(dirname "$(dirname "$LONG")")")  # runs/NAME/sft/model
LONG_BENCHMARK=${LONG_BENCHMARK:-chain_verbose}
R3_STEPS=${R3_STEPS:-2 5}
R4_STEPS=${R4_STEPS:-4 12}
BY_LENGTH=${BY_LENGTH-2 4 6 8 10 12 14 16}
PROBLEMS_PER_LENGTH=${PROBLEMS_PER_LENGTH:-32}
BACKEND=${BACKEND:-vllm}
PROBLEMS=${PROBLEMS:-64}
RUNS=${RUNS:-runs/ladder}
OUT=${OUT:-$RUNS/ladder.json}
PER_STEP_TOKENS=${PER_STEP_TOKENS:-100}  # generation budget per step of the LONG task (plain chain: 8)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# model  tag  benchmark  rung  min_steps  max_steps  problems  tokens-per-step
LADDER=(
  "embedded tiny-chain chain R1 4 12 $PROBLEMS 8"
  "embedded tiny-chain chain R2 14 20 $PROBLEMS 8"
  "embedded tiny-chain chain plain-40-60 40 60 $PROBLEMS 8"
  "$LONG $LONG_TAG $LONG_BENCHMARK R3 $R3_STEPS $PROBLEMS $PER_STEP_TOKENS"
  "$LONG $LONG_TAG $LONG_BENCHMARK R4 $R4_STEPS $PROBLEMS $PER_STEP_TOKENS"
)
for steps in $BY_LENGTH; do
  LADDER+=("$LONG $LONG_TAG $LONG_BENCHMARK steps$steps $steps $steps $PROBLEMS_PER_LENGTH $PER_STEP_TOKENS")
done
have_long=$($PYTHON -c "import sys; from pathlib import Path; from rredcot_cli.policy.models import resolve_model_path; \
print(int(Path(resolve_model_path(sys.argv[1]), 'config.json').is_file()))" "$LONG")
started=$SECONDS
for entry in "${LADDER[@]}"; do
  read -r model tag benchmark rung lo hi problems per_step <<<"$entry"
  if [[ "$tag" == "$LONG_TAG" && "$have_long" != 1 ]]; then
    echo "ladder: no model at LONG=$LONG; skipping $rung"
    continue
  fi
  budget=$((per_step * hi + 64))  # the answer line and slack
  common=(model.path="$model" backend="$BACKEND" benchmark="$benchmark" benchmark.min_steps="$lo"
          benchmark.max_steps="$hi" sampling.max_new_tokens="$budget" eval.num_problems="$problems" seed=0)
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
