#!/usr/bin/env bash
# The length ladder's headroom table (docs/long-chains.md): sampled pass@1 (8 samples at T=1)
# and greedy accuracy of each model on each rung, with the completion length, via `rredcot eval`.
#
#   LONG=runs/tiny-chain-long/sft/model scripts/ladder.sh
#   BACKEND=hf PROBLEMS=16 scripts/ladder.sh        # a quick look with the HF backend
#
# Environment:
#   LONG      the long-chain model folder (default runs/tiny-chain-long/sft/model); skipped if absent
#   BACKEND   vllm (default; the CPU build in .venv-vllm samples long chains ~6x faster) or hf
#   PROBLEMS  test problems per rung (default 64)
#   RUNS      where the eval run dirs go (default runs/ladder); OUT the JSON summary (default
#             docs/bench/ladder.json)
# A finished eval (same config) is skipped by `rredcot eval` itself, so the script can be rerun.
set -euo pipefail

PYTHON=${PYTHON:-python}
LONG=${LONG:-runs/tiny-chain-long/sft/model}
BACKEND=${BACKEND:-vllm}
PROBLEMS=${PROBLEMS:-64}
RUNS=${RUNS:-runs/ladder}
OUT=${OUT:-docs/bench/ladder.json}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

MODELS="embedded"
[[ -d "$LONG" ]] && MODELS="$MODELS $LONG"
RUNGS=("R1 4 12" "R2 14 20" "R3 40 60" "R4 80 90")
started=$SECONDS
for model in $MODELS; do
  tag=$(basename "$(dirname "$(dirname "$model")")")
  [[ "$model" == embedded ]] && tag=tiny-chain
  for rung in "${RUNGS[@]}"; do
    read -r name lo hi <<<"$rung"
    budget=$((8 * hi + 64))  # ~6 tokens a step, plus the answer line and slack
    common=(model.path="$model" backend="$BACKEND" benchmark=chain benchmark.min_steps="$lo" benchmark.max_steps="$hi"
            sampling.max_new_tokens="$budget" eval.num_problems="$PROBLEMS" seed=0)
    $PYTHON -m rredcot_cli eval run.dir="$RUNS/$tag/$name-sampled" "${common[@]}" eval.n=8 "eval.k=[1,8]"
    $PYTHON -m rredcot_cli eval run.dir="$RUNS/$tag/$name-greedy" "${common[@]}" eval.n=1 "eval.k=[1]" eval.temperature=0
  done
done
echo "ladder: $((SECONDS - started)) s"

$PYTHON - "$RUNS" "$OUT" <<'PY'
import json, platform, sys
from pathlib import Path
runs, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for metrics in sorted(runs.glob("*/*/eval/metrics.json")):
    m = json.loads(metrics.read_text())
    model, (rung, mode) = metrics.parents[2].name, metrics.parents[1].name.split("-")
    rows.append({"model": model, "rung": rung, "mode": mode, "pass@1": m["pass@1"], "pass@8": m.get("pass@8"),
                 "mean_tokens": m["mean_tokens"], "problems": m["num_problems"], "seconds": m.get("seconds")})
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"machine": platform.platform(), "rows": rows}, indent=2) + "\n")
print(f"{'model':<16}{'rung':<6}{'mode':<9}{'pass@1':>8}{'tokens':>8}")
for r in rows:
    print(f"{r['model']:<16}{r['rung']:<6}{r['mode']:<9}{r['pass@1']:>8.3f}{r['mean_tokens']:>8.0f}")
PY
