#!/usr/bin/env bash
# Puts the where-credit-pays study (issue 39) back to work after its machine was replaced: the steps of
# results/where-credit-pays/run-log.md, "How a working session restarts the drivers", as one command.
#
#   scripts/where_credit_pays_resume.sh start A B-embedded   # worktrees, committed runs back, drivers, keeping loop
#   scripts/where_credit_pays_resume.sh keep                 # the keeping loop in the foreground (start runs it in the background)
#   ONCE=1 scripts/where_credit_pays_resume.sh keep          # one pass of it (before a working session ends)
#   scripts/where_credit_pays_resume.sh status               # per setting: its driver, finished runs, runs in flight
#   scripts/where_credit_pays_resume.sh finish               # before a working session ends: a keeping pass, the
#                                                            # drivers' logs committed, then status
#   DRY_RUN=1 scripts/where_credit_pays_resume.sh start A    # print the commands instead of running them
#
# start, per setting: a worktree at the setting's pinned commit (the registration's code, never main's),
# the committed finished runs copied back into it by scripts/keep_finished_runs.py (so its driver skips
# them), and its driver, scripts/where_credit_pays.sh at that commit, started in its own session with one
# thread, unless a driver started here still runs. Then the keeping loop, unless it runs already.
# keep: every INTERVAL seconds, each setting's finished runs are copied from its worktree into this
# checkout and committed (nothing is read from a run but its manifest's status), so that a replaced
# machine loses only the runs in flight. Run from the main checkout, which must be on a branch.
#
# Environment: WORKTREES (default ../where-credit-pays next to this checkout: a worktree per setting,
# and logs/ with the drivers' logs, their pid files and keep.log), PYTHON (default .venv/bin/python of
# this checkout; made absolute, the drivers run in the worktrees), INTERVAL (default 600), ONCE (1: one
# keeping pass), DRY_RUN (1: print only).
set -euo pipefail
mode=${1:?usage: where_credit_pays_resume.sh start SETTING... | keep | status | finish}
shift

# The commits each setting was registered and started at (run-log.md's header names the same).
declare -A PINNED=([A]=4fc0b6f [B-embedded]=f2afc38 [B-smollm2]=bc2bbbf)

ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
STUDY=results/where-credit-pays
WORKTREES=$(realpath -m "${WORKTREES:-$ROOT/../where-credit-pays}")
LOGS=$WORKTREES/logs
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[[ $PYTHON == */* ]] && PYTHON=$(realpath -ms "$PYTHON")  # -s: a venv's python is a symlink out of it
INTERVAL=${INTERVAL:-600}
DRY_RUN=${DRY_RUN:-0}

run() {  # run COMMAND...: print it (DRY_RUN=1) or run it
  if [[ $DRY_RUN == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

alive() {  # alive PIDFILE: the process it names still runs
  [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

keep_pass() {  # one pass: every setting's finished runs copied from its worktree and committed
  local setting source copied kept
  for setting in "${!PINNED[@]}"; do
    source=$WORKTREES/$setting/$STUDY/$setting
    [[ -d $source ]] || continue
    if [[ $DRY_RUN == 1 ]]; then
      run nice "$PYTHON" scripts/keep_finished_runs.py "$source" "$STUDY/$setting"
      run git commit -q -m "where-credit-pays $setting: finished runs as they finish" -- "$STUDY/$setting"
      continue
    fi
    copied=$(nice "$PYTHON" scripts/keep_finished_runs.py "$source" "$STUDY/$setting" 2>&1) || true
    echo "$(date -u +%FT%TZ) $setting: $(grep -m1 'finished runs of' <<<"$copied" || tail -n1 <<<"$copied")"
    kept=$(grep -o '[0-9]* finished runs of' <<<"$copied" | grep -o '^[0-9]*' || echo "?")
    [[ -d $STUDY/$setting ]] || continue  # nothing finished yet, so nothing was copied and there is nothing to add
    # A commit made by hand at the same moment holds git's index lock: say so and try again next pass,
    # rather than let the loop die (set -e).
    if ! git add -- "$STUDY/$setting"; then echo "git add failed; the next pass tries again"; continue; fi
    if ! git diff --cached --quiet -- "$STUDY/$setting"; then
      git commit -q -m "where-credit-pays $setting: finished runs as they finish ($kept kept so far; copied by scripts/keep_finished_runs.py, not read)" \
        -- "$STUDY/$setting" || echo "git commit failed; the next pass tries again"
    fi
  done
}

status() {  # per setting with a worktree: is its driver alive, how many runs finished, which are in flight
  local setting study manifest finished
  for setting in "${!PINNED[@]}"; do
    study=$WORKTREES/$setting/$STUDY/$setting
    [[ -d $study ]] || continue
    if alive "$LOGS/$setting.pid"; then echo "$setting: driver running (pid $(cat "$LOGS/$setting.pid"))"
    else echo "$setting: no driver running"; fi
    finished=0
    # Only each manifest's status is read (no interim look); rollouts/ and checkpoints/ hold no runs.
    while IFS= read -r manifest; do
      if grep -qs '"status": "complete"' "$manifest"; then finished=$((finished + 1))
      else echo "  in flight or stopped: ${manifest%/train/manifest.json} (manifest last written $(date -u -r "$manifest" +%FT%TZ))"; fi
    done < <(find "$study" -path '*/rollouts' -prune -o -path '*/checkpoints' -prune -o -path '*/train/manifest.json' -print | sort)
    echo "  finished runs: $finished"
  done
}

# The drivers' logs, into the study as driver-logs/<machine>-<setting>.log (machines.csv's last row: the
# machine start registered). A log grows over the restarts on one machine, so a later copy of it is a
# superset of an earlier one; a new machine starts a new file.
commit_driver_logs() {
  local machine setting log copy
  machine=$(tail -n1 "$STUDY/machines.csv" | cut -d, -f1)
  for log in "$LOGS"/*.log; do
    [[ -f $log ]] || continue
    setting=$(basename "$log" .log)
    [[ -n ${PINNED[$setting]:-} ]] || continue  # keep.log and others are not a driver's
    copy=$STUDY/driver-logs/$machine-$setting.log
    run cp "$log" "$copy"
    run git add -- "$copy"
  done
  if [[ $DRY_RUN == 1 ]]; then
    run git commit -q -m "where-credit-pays: the drivers' logs on machine $machine" -- "$STUDY/driver-logs"
  elif ! git diff --cached --quiet -- "$STUDY/driver-logs"; then
    git commit -q -m "where-credit-pays: the drivers' logs on machine $machine (copied, not read)" -- "$STUDY/driver-logs"
  fi
}

case $mode in
  status) status; exit 0 ;;
  finish) keep_pass; commit_driver_logs; status; exit 0 ;;
  keep)
    while true; do
      keep_pass
      [[ ${ONCE:-0} == 1 || $DRY_RUN == 1 ]] && exit 0
      sleep "$INTERVAL"
    done ;;
  start) ;;
  *) echo "error: unknown mode '$mode'; use start SETTING..., keep, status or finish" >&2; exit 2 ;;
esac

(( $# > 0 )) || { echo "error: name the settings to start, e.g. start A B-embedded (pinned: ${!PINNED[*]})" >&2; exit 2; }
for setting in "$@"; do
  [[ -n ${PINNED[$setting]:-} ]] || { echo "error: no pinned commit for setting '$setting'; pick from: ${!PINNED[*]}" >&2; exit 2; }
done
[[ -x $PYTHON || $DRY_RUN == 1 ]] || { echo "error: no Python at $PYTHON; install this checkout (README) or set PYTHON" >&2; exit 2; }
[[ $DRY_RUN == 1 ]] || mkdir -p "$LOGS"

# The machine first: a row in the study's machines.csv when this one is new, from which the ledger
# names each run's machine (the runs at the pinned commits do not record their CPU; docs/failure-modes.md).
run "$PYTHON" scripts/study_machine.py "$STUDY/machines.csv"

for setting in "$@"; do
  worktree=$WORKTREES/$setting
  pin=${PINNED[$setting]}
  if [[ -d $worktree ]]; then
    head=$(git -C "$worktree" rev-parse HEAD)
    [[ $head == "$pin"* ]] || { echo "error: $worktree is at ${head:0:7}, not $setting's pinned $pin; remove it (git worktree remove) and rerun" >&2; exit 2; }
  else
    run git worktree prune
    run git worktree add --detach "$worktree" "$pin"
  fi
  if [[ -d $STUDY/$setting ]]; then
    run "$PYTHON" scripts/keep_finished_runs.py "$STUDY/$setting" "$worktree/$STUDY/$setting"
  else
    echo "no committed runs of $setting yet: nothing to put back"
  fi
  if alive "$LOGS/$setting.pid"; then
    echo "the driver of $setting already runs (pid $(cat "$LOGS/$setting.pid")); not started again"
    continue
  fi
  if [[ $DRY_RUN == 1 ]]; then
    echo "cd $(printf '%q' "$worktree") && PYTHONPATH=$(printf '%q' "$worktree") OMP_NUM_THREADS=1 MKL_NUM_THREADS=1" \
      "RESULTS=$STUDY PYTHON=$(printf '%q' "$PYTHON") setsid nohup scripts/where_credit_pays.sh $setting >> $(printf '%q' "$LOGS/$setting.log")"
    continue
  fi
  # One thread per driver (the registered runs' timings assume it); setsid so that the driver outlives
  # this shell and a terminal hang-up. A simple command in the background, so that $! is the driver itself
  # (setsid forks no further): `kill -- -PID` then stops the driver and its run.
  (
    cd "$worktree"
    PYTHONPATH=$worktree OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RESULTS=$STUDY PYTHON=$PYTHON \
      setsid nohup scripts/where_credit_pays.sh "$setting" >> "$LOGS/$setting.log" 2>&1 < /dev/null &
    echo $! > "$LOGS/$setting.pid"
  )
  echo "$(date -u +%FT%TZ) started the driver of $setting at $pin (pid $(cat "$LOGS/$setting.pid"), log $LOGS/$setting.log)"
done

if alive "$LOGS/keep.pid"; then
  echo "the keeping loop already runs (pid $(cat "$LOGS/keep.pid"))"
elif [[ $DRY_RUN == 1 ]]; then
  echo "setsid nohup $0 keep >> $(printf '%q' "$LOGS/keep.log")"
else
  (WORKTREES=$WORKTREES PYTHON=$PYTHON INTERVAL=$INTERVAL setsid nohup bash "$ROOT/scripts/where_credit_pays_resume.sh" keep \
    >> "$LOGS/keep.log" 2>&1 < /dev/null & echo $! > "$LOGS/keep.pid")
  echo "started the keeping loop (pid $(cat "$LOGS/keep.pid"), every $INTERVAL s, log $LOGS/keep.log)"
fi
