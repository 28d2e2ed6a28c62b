#!/usr/bin/env bash
# Train every credit method x seed at the default settings (equal budgets: same steps, prompts,
# samples and eval for all), then build the comparison report.
#
#   scripts/compare_methods.sh                          # grpo, rredcot and every registered method; seeds 0 1 2
#   METHODS="grpo rredcot" SEEDS="0 1" scripts/compare_methods.sh
#   EXTRA="train.steps=1 train.eval_problems=2" RUNS=/tmp/cmp REPORT=/tmp/cmp-report scripts/compare_methods.sh
#
# Environment:
#   METHODS  methods to train (default: grpo rredcot, then the rest of rredcot_cli.methods.method_names())
#   SEEDS    seeds (default: 0 1 2)
#   EXTRA    overrides added to every `rredcot train` (default: none, i.e. the default settings)
#   RUNS     folder of the run dirs, one per method and seed: $RUNS/<method>-seed<seed> (default: runs/compare)
#   REPORT   where `rredcot report` writes (default: runs/compare-report; the committed results/ are
#            written only when REPORT names them, e.g. REPORT=results/method-comparison/report)
#   RREDCOT  the command (default: rredcot if on PATH, else python -m rredcot_cli)
#
# A run whose train/manifest.json says "complete" is skipped (whatever EXTRA it was made with), so
# the script can be rerun after an interruption; an unfinished run is resumed from its last checkpoint
# (train.resume=true; with other options than its first attempt `rredcot train` refuses it in one
# line). The report covers every run dir in $RUNS.
# $REPORT/compare_methods.txt records the machine, the commands and their wall times.
set -euo pipefail

PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${RREDCOT:-}" ]]; then
  if command -v rredcot >/dev/null 2>&1; then RREDCOT=rredcot; else RREDCOT="$PYTHON -m rredcot_cli"; fi
fi
if [[ -z "${METHODS:-}" ]]; then
  registered=$($PYTHON -c "from rredcot_cli.methods import method_names; print(*method_names())")
  METHODS="grpo rredcot"
  for m in $registered; do
    [[ " $METHODS " == *" $m "* ]] || METHODS="$METHODS $m"
  done
fi
SEEDS=${SEEDS:-"0 1 2"}
EXTRA=${EXTRA:-}
RUNS=${RUNS:-runs/compare}
REPORT=${REPORT:-runs/compare-report}

finished() {  # true when $1/train/manifest.json says the stage is complete
  $PYTHON - "$1/train/manifest.json" <<'EOF'
import json, sys
try:
    sys.exit(0 if json.load(open(sys.argv[1])).get("status") == "complete" else 1)
except (OSError, ValueError):
    sys.exit(1)
EOF
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
{
  echo "# scripts/compare_methods.sh"
  echo "started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "machine: $(uname -srm), $(getconf _NPROCESSORS_ONLN) CPUs ($(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)), $($PYTHON -c 'import platform, torch; print("python", platform.python_version(), "torch", torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")')"
  echo "git: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$REPO" diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
  echo "METHODS=$METHODS SEEDS=$SEEDS EXTRA=$EXTRA"
} >>"$log"

start_all=$SECONDS
for method in $METHODS; do
  for seed in $SEEDS; do
    run="$RUNS/$method-seed$seed"
    if finished "$run"; then
      echo "skip $run (finished)"
      echo "skipped (finished): $run" >>"$log"
      continue
    fi
    resume=()
    if [[ -f "$run/train/manifest.json" ]]; then  # an unfinished attempt: continue it, never start it over
      resume=(train.resume=true)
      echo "resume $run (unfinished)"
    fi
    # shellcheck disable=SC2086  # EXTRA holds several overrides
    cmd=($RREDCOT train "method=$method" "seed=$seed" "run.dir=$run" "${resume[@]}" $EXTRA)
    echo "+ ${cmd[*]}"
    start=$SECONDS
    "${cmd[@]}"
    echo "$((SECONDS - start)) s: ${cmd[*]}" >>"$log"
  done
done

# shellcheck disable=SC2086
report_cmd=($RREDCOT report "$RUNS"/* --out "$REPORT")
echo "+ ${report_cmd[*]}"
"${report_cmd[@]}"
{
  echo "${report_cmd[*]}"
  echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ), total wall time $((SECONDS - start_all)) s"
} >>"$log"
cp "$log" "$REPORT/compare_methods.txt"
echo "$REPORT/compare_methods.txt"
