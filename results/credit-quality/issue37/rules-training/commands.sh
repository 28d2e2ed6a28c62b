#!/usr/bin/env bash
# Issue 37 item 5: a short training check of RREDCoT's advantage rules at R1 (the embedded model on
# chain 4-12 steps, the default budget: 30 steps x 8 prompts x 8 samples, lr 3e-5), three seeds, each
# seed also the data order. Run at the commit their manifests record (before 1d99ebb, the same-state exact-weight fix of
# suffix_is), busy machine (six to eight other jobs on two cores). GRPO only at seed 0 (seeds 1-2 were
# stopped to free the cores).
set -euo pipefail
export OMP_NUM_THREADS=1
for seed in 0 1 2; do for rule in immediate mixed reward_to_go; do
  rredcot train method=rredcot method.advantage=$rule seed=$seed train.data_order_seed=$seed run.dir=runs/rules/$rule-seed$seed
done; done
rredcot train method=grpo seed=0 train.data_order_seed=0 run.dir=runs/rules/grpo-seed0
