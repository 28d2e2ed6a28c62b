#!/usr/bin/env bash
# The registered protocol of docs/studies/where-credit-pays.md, and nothing else: every number (budget, arms,
# seeds, rate grid, tuning seeds, margin) is read from results/where-credit-pays/protocol.json, the
# file the document embeds verbatim (tests/test_where_credit_pays.py keeps the two equal).
#
#   scripts/where_credit_pays.sh A                  # the primary arms: rate sweep, then 20 seeds each, then the verdicts
#   scripts/where_credit_pays.sh A further          # RLOO and GRPO+cancellation batching, if the CPU budget allows
#   DRY_RUN=1 scripts/where_credit_pays.sh A        # print the commands instead of running them
#   RESULTS=results/where-credit-pays scripts/where_credit_pays.sh A   # the registered study's folder
#
# Per arm: scripts/lr_sweep.py on the tuning seeds (its own resume; its choice in
# OUT/sweep/<arm>/lr_sweep.json), then one run per evaluation seed at the chosen rate, seed and
# train.data_order_seed = the seed, in OUT/runs/<arm>-lr<lr>-seed<seed> (OUT = RESULTS/<setting>).
# Resumable: rerun the same command; a finished sweep (its lr_sweep.json) or run (manifest
# "complete") is skipped, an unfinished one continues from its last checkpoint (train.resume=true);
# a finished run's checkpoints are deleted (its metrics, evals, rollouts and manifest are kept, to be
# committed). A failed main run does not stop the others: it is listed in OUT/failed_runs.txt (every
# run is reported, failed ones too) and the script exits 1 at the end. Last, once every registered
# run of the phase is finished (no interim looks), bench/paired_seeds.py writes
# OUT/verdict_mean_eval.json (the primary endpoint) and OUT/verdict_final.json (the secondary).
#
# Environment: RESULTS (default runs/where-credit-pays: the study's own folder only when set
# explicitly), PROTOCOL (default results/where-credit-pays/protocol.json; a smaller one for a smoke
# run), PYTHON (default python), JOBS (sweep runs at a time, default 1), DRY_RUN (1: print only),
# FINAL (1: the verdicts with failed runs left out, after they were retried once).
set -euo pipefail
setting=${1:?usage: where_credit_pays.sh SETTING [primary|further]  (SETTING: a key of protocol.json settings, e.g. A)}
phase=${2:-primary}
PROTOCOL=${PROTOCOL:-results/where-credit-pays/protocol.json}
RESULTS=${RESULTS:-runs/where-credit-pays}
PYTHON=${PYTHON:-python}
JOBS=${JOBS:-1}
DRY_RUN=${DRY_RUN:-0}
OUT=$RESULTS/$setting

# proto FIELD...: one protocol value per line (the setting's unless the field starts with '/').
proto() {
  "$PYTHON" - "$PROTOCOL" "$setting" "$@" <<'PY'
import json, sys
path, setting, *fields = sys.argv[1:]
try:
    protocol = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"error: cannot read the protocol {path} ({e}); run from the repository root or set PROTOCOL", file=sys.stderr)
    sys.exit(2)
node = protocol if fields[0].startswith("/") else protocol["settings"].get(setting)
if node is None:
    print(f"error: {path} registers no setting {setting!r}; pick one of {', '.join(protocol['settings'])}", file=sys.stderr)
    sys.exit(2)
for field in fields:
    node = node[field.lstrip("/")]
for value in (node if isinstance(node, list) else list(node) if isinstance(node, dict) else [node]):
    print(format(value, "g") if isinstance(value, float) else value)
PY
}

status=$(proto status)
if [[ $status != registered ]]; then
  registered=$("$PYTHON" -c 'import json, sys; settings = json.load(open(sys.argv[1]))["settings"]
print(", ".join(name for name, s in settings.items() if s["status"] == "registered"))' "$PROTOCOL")
  echo "error: setting $setting is registered as '$status' in $PROTOCOL (docs/studies/where-credit-pays.md says what it needs); run a registered one: $registered" >&2
  exit 2
fi
case $phase in
  primary) arm_group=arms ;;
  further) arm_group=further_arms ;;
  *) echo "error: unknown phase '$phase'; use primary or further" >&2; exit 2 ;;
esac

mapfile -t BUDGET < <(proto budget)
mapfile -t ARMS < <(proto "$arm_group")
if (( ${#ARMS[@]} == 0 )); then
  echo "setting $setting registers no $phase arms in $PROTOCOL; nothing to run"
  exit 0
fi
mapfile -t SEEDS < <(proto eval_seeds)
mapfile -t LRS < <(proto lr_sweep lrs)
mapfile -t TUNING < <(proto lr_sweep tuning_seeds)
LAST_EVALS=$(proto lr_sweep last_evals)
MARGIN=$(proto /statistics margin)
BASELINE=$(proto /statistics baseline)

run() {  # run COMMAND...: print it (DRY_RUN=1) or run it
  if [[ $DRY_RUN == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

arm_method() {  # arm_method ARM: the method= of the arm's overrides
  proto "$arm_group" "$1" | sed -n 's/^method=//p'
}

arm_options() {  # arm_options ARM: the arm's overrides other than method=
  proto "$arm_group" "$1" | grep -v '^method=' || true
}

chosen_lr() {  # chosen_lr ARM: the sweep's rate for the arm (LR_FROM_SWEEP in a dry run before the sweep)
  local record=$OUT/sweep/$1/lr_sweep.json
  if [[ ! -f $record ]]; then
    if [[ $DRY_RUN == 1 ]]; then echo "LR_FROM_SWEEP"; return; fi
    echo "error: $record is missing: the sweep of arm $1 did not finish" >&2; return 2
  fi
  "$PYTHON" -c 'import json, sys; print(format(json.load(open(sys.argv[1]))["choice"][sys.argv[2]]["lr"], "g"))' \
    "$record" "$(arm_method "$1")"
}

# The further arms run only if the primary block's measured run seconds leave room for them in the
# registered total (decided from times alone, never from results).
further_allowed() {
  "$PYTHON" - "$OUT" "$(proto cpu_budget_core_hours total)" "${#ARMS[@]}" "$(( ${#LRS[@]} * ${#TUNING[@]} + ${#SEEDS[@]} ))" \
    "$BASELINE" <<'PY'
import json, sys
from pathlib import Path
out, hours, arms, runs_per_arm, baseline = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
spent = sum(json.loads(p.read_text())["seconds"] for p in out.glob("*/**/train/summary.json"))
base = [json.loads(p.read_text())["seconds"] for p in out.glob(f"runs/{baseline}-lr*/train/summary.json")]
if not base:
    sys.exit(f"error: no finished {baseline} main run under {out}/runs: run the primary phase first")
projected = arms * runs_per_arm * sum(base) / len(base)
decision = {"spent_core_hours": round(spent / 3600, 2), "projected_core_hours": round(projected / 3600, 2),
            "budget_core_hours": hours, "run": spent + projected <= hours * 3600}
(out / "further_arms_decision.json").write_text(json.dumps(decision, indent=2) + "\n")
print(json.dumps(decision))
sys.exit(0 if decision["run"] else 1)
PY
}

if [[ $phase == further && $DRY_RUN != 1 ]] && ! further_allowed; then
  echo "the further arms do not fit the registered CPU budget ($OUT/further_arms_decision.json); not run"
  exit 0
fi
[[ $DRY_RUN == 1 ]] || mkdir -p "$OUT/runs"
echo "# setting $setting, $phase arms: ${ARMS[*]}; seeds ${SEEDS[*]}; budget ${BUDGET[*]}"

# 1. The rate sweep, one per arm (each arm's own options; the same budget and grid for all). A
# finished sweep (its lr_sweep.json) is not rerun; its runs' checkpoints are deleted once it finishes.
for arm in "${ARMS[@]}"; do
  if [[ $DRY_RUN != 1 && -f $OUT/sweep/$arm/lr_sweep.json ]]; then echo "skip sweep $OUT/sweep/$arm (lr_sweep.json)"; continue; fi
  mapfile -t options < <(arm_options "$arm")
  run "$PYTHON" scripts/lr_sweep.py --methods "$(arm_method "$arm")" --lrs "${LRS[@]}" --tuning-seeds "${TUNING[@]}" \
    --eval-seeds "${SEEDS[@]}" --last-evals "$LAST_EVALS" --jobs "$JOBS" --out "$OUT/sweep/$arm" \
    -- "${BUDGET[@]}" "${options[@]}"
  [[ $DRY_RUN == 1 ]] || rm -rf "$OUT/sweep/$arm"/*/train/checkpoints
done

# 2. The main runs, seed by seed (both arms of a pair close together in time).
failed=0
for seed in "${SEEDS[@]}"; do
  for arm in "${ARMS[@]}"; do
    lr=$(chosen_lr "$arm")
    dir=$OUT/runs/$arm-lr$lr-seed$seed
    if grep -qs '"status": "complete"' "$dir/train/manifest.json"; then echo "skip $dir (complete)"; continue; fi
    mapfile -t arm_overrides < <(proto "$arm_group" "$arm")
    code=0
    run "$PYTHON" -m rredcot_cli train "${BUDGET[@]}" "${arm_overrides[@]}" train.lr="$lr" seed="$seed" \
      train.data_order_seed="$seed" run.dir="$dir" train.resume=true || code=$?
    if (( code == 0 )); then
      [[ $DRY_RUN == 1 ]] || rm -rf "$dir/train/checkpoints"
    else
      failed=1
      echo "$dir failed (exit $code, $(date -u +%FT%TZ))" | tee -a "$OUT/failed_runs.txt" >&2
    fi
  done
done

# 3. The verdicts: every arm against the baseline, primary and secondary endpoint, only once every
# registered run of the phase is finished (no interim looks); FINAL=1 computes them with the runs that
# failed twice left out (listed in failed_runs.txt, a deviation to report).
unfinished=0
for seed in "${SEEDS[@]}"; do
  for arm in "${ARMS[@]}"; do
    grep -qs '"status": "complete"' "$OUT/runs/$arm-lr$(chosen_lr "$arm")-seed$seed/train/manifest.json" || unfinished=$((unfinished + 1))
  done
done
if [[ $DRY_RUN != 1 && $unfinished -gt 0 && ${FINAL:-0} != 1 ]]; then
  echo "$unfinished of $(( ${#ARMS[@]} * ${#SEEDS[@]} )) registered runs are not finished: no verdict yet (no interim looks); rerun this command, or set FINAL=1 once failed runs have been retried" >&2
  exit 1
fi
others=()
for arm in "${ARMS[@]}"; do [[ $arm == "$BASELINE" ]] || others+=("$arm"); done
for endpoint in mean-eval final; do
  run "$PYTHON" bench/paired_seeds.py "$OUT/runs" --methods "${others[@]}" --baseline "$BASELINE" \
    --endpoint "$endpoint" --margin "$MARGIN" --out "$OUT/verdict_${endpoint//-/_}.json"
done
exit $failed
