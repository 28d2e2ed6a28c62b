#!/usr/bin/env bash
# The small real-model study (docs/studies/real-model.md): SmolLM2-135M-Instruct on benchmark=arith.
#
#   scripts/real_model_study.sh pilot     # GRPO, seed 0, at each of $LRS: does it learn in the budget?
#   LR=1e-5 scripts/real_model_study.sh study   # grpo, rredcot (suffix_is), rloo x $SEEDS at one lr
#
# Environment: LRS (pilot; default "1e-5 3e-5 1e-4"), LR (study), SEEDS (default "0 1 2 3 4"),
# METHODS (study; default "grpo rredcot rloo"), RUNS (default runs/real-model), EXTRA (more overrides),
# JOBS (runs at a time, default 1: on a GPU several small runs share the device; their seconds are then
# busy figures), PYTHON (default python).
# Every run: 4 prompts x 8 samples per step, up to 48 new tokens, one pass over the batch in one
# minibatch (one AdamW step per training step), 20 steps, held-out pass@1 on the 39 test questions
# x 4 samples at steps 0, 10 and 20 (30-70 s a step on one busy core of this machine: the update is
# ~6 x 135M x 2.3k tokens of matmuls); its weights are deleted once it finishes
# (a 538 MB checkpoint per run), its metrics, evals and manifest are kept. A finished run is skipped;
# an unfinished one is resumed (train.resume=true) rather than started over.
set -euo pipefail
mode=${1:?usage: real_model_study.sh pilot|study}
RUNS=${RUNS:-runs/real-model}
SEEDS=${SEEDS:-"0 1 2 3 4"}
METHODS=${METHODS:-"grpo rredcot rloo"}
BUDGET=(model=smollm2-135m-instruct benchmark=arith sampling.max_new_tokens=48 train.steps=20
        train.prompts_per_step=4 sampling.n=8 train.updates_per_batch=1 train.minibatch_size=32
        train.eval_every=10 train.eval_problems=39 train.eval_samples=4 train.save_every=0)

PYTHON=${PYTHON:-python}
JOBS=${JOBS:-1}

train() {  # train RUN_DIR OVERRIDES...
  local dir=$1; shift
  if grep -qs '"status": "complete"' "$dir/train/manifest.json"; then echo "skip $dir (complete)"; return; fi
  local started=$SECONDS resume=()
  if [[ -f "$dir/train/manifest.json" ]]; then  # an unfinished attempt: continue it, never start it over
    resume=(train.resume=true)
    echo "resume $dir (unfinished)"
  fi
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  $PYTHON -m rredcot_cli train "${BUDGET[@]}" "$@" ${EXTRA:-} run.dir="$dir" "${resume[@]}"
  rm -rf "$dir/train/checkpoints"
  echo "$dir: $((SECONDS - started)) s (JOBS=$JOBS)" | tee -a "$RUNS/wall_times.txt"
}

launch() {  # launch RUN_DIR OVERRIDES...: at most JOBS runs at a time; a failed run fails the script
  if (( JOBS <= 1 )); then train "$@"; return; fi
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n; done
  train "$@" > "$1.log" 2>&1 &
  pids+=($!)
}
pids=()

mkdir -p "$RUNS"
case $mode in
  pilot)
    for lr in ${LRS:-1e-5 3e-5 1e-4}; do launch "$RUNS/pilot-grpo-lr$lr" method=grpo train.lr="$lr" seed=0; done ;;
  study)
    : "${LR:?set LR to the learning rate the pilot chose}"
    for seed in $SEEDS; do
      for method in $METHODS; do launch "$RUNS/$method-lr$LR-seed$seed" method="$method" train.lr="$LR" seed="$seed"; done
    done ;;
  *) echo "unknown mode $mode (pilot | study)" >&2; exit 2 ;;
esac
# Parallel runs: wait for each and fail if any failed (its log is RUN_DIR.log).
failed=0
for pid in "${pids[@]}"; do wait "$pid" || { failed=1; echo "a run failed (see RUN_DIR.log)" >&2; }; done
exit $failed
