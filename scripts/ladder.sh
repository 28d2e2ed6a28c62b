#!/usr/bin/env bash
# The length ladder's headroom table (docs/long-chains.md): sampled pass@1 (8 samples at T=1)
# and greedy accuracy of each model on each rung, with the completion length, via `rredcot eval`.
#
#   scripts/ladder.sh                              # both shipped models, vLLM on the CPU
#   BACKEND=hf PROBLEMS=16 scripts/ladder.sh       # a quick look with the HF backend
#   LONG=runs/tiny-chain-iterated/sft/model scripts/ladder.sh   # a freshly trained long-chain model
#
# Rungs: R1 and R2 are the plain `chain` task with the shipped tiny-chain; R3 and R4 are
# `chain_iterated` (one map applied again and again, ~11 tokens a step) with tiny-chain-long. Each model is also
# measured on other lengths where that says something (tiny-chain on long plain chains: the
# length cliff; tiny-chain-long on shorter and longer iterated chains: accuracy by length).
#
# Environment:
#   LONG      the long-chain model (default: the shipped tiny-chain-long); skipped if absent
#   BACKEND   vllm (default; the CPU build samples long chains ~6x faster than HF) or hf
#   PROBLEMS  test problems per rung (default 64)
#   RUNS      where the eval run dirs go (default runs/ladder); OUT the JSON summary (default
#             docs/bench/ladder.json)
# A finished eval (same config) is skipped by `rredcot eval` itself, so the script can be rerun.
set -euo pipefail

PYTHON=${PYTHON:-python}
LONG=${LONG:-tiny-chain-long}
BACKEND=${BACKEND:-vllm}
PROBLEMS=${PROBLEMS:-64}
RUNS=${RUNS:-runs/ladder}
OUT=${OUT:-docs/bench/ladder.json}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# model  tag  benchmark  rung  min_steps  max_steps
LADDER=(
  "embedded tiny-chain chain R1 4 12"
  "embedded tiny-chain chain R2 14 20"
  "embedded tiny-chain chain plain-40-60 40 60"
  "$LONG tiny-chain-long chain_iterated iterated-4-12 4 12"
  "$LONG tiny-chain-long chain_iterated iterated-14-20 14 20"
  "$LONG tiny-chain-long chain_iterated R3 25 30"
  "$LONG tiny-chain-long chain_iterated R4 45 55"
  "$LONG tiny-chain-long chain_iterated iterated-60-70 60 70"
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
  per_step=8
  [[ "$benchmark" == chain_iterated ]] && per_step=13  # "52: 4*7+1=9" and a newline
  budget=$((per_step * hi + 64))  # the answer line and slack
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
