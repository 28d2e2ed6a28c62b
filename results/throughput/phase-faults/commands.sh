# Allocator A/B of issue 13 (2026-12-03, commit b1db077, OMP_NUM_THREADS=1, the machine shared with
# two R4 training runs: fault counts are load-independent, CPU seconds are busy-machine figures).
# The script that ran was bench/phase_faults.py's first version (the same wrapper, without argv in
# the record); each line of faults.jsonl is one run.
M="MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_TOP_PAD_=536870912"
for method in grpo rredcot; do
  for mode in default malloc; do
    if [ $mode = malloc ]; then envs="$M"; else envs=""; fi
    env $envs LABEL=$method-$mode-r0 python bench/phase_faults.py train method=$method seed=0 train.steps=8 \
      train.eval_every=8 train.save_every=0 train.save_rollouts=0 backend.num_threads=1 \
      run.dir=/tmp/i13/runs/$method-$mode run.overwrite=true
  done
done
