#!/usr/bin/env bash
# issue 42 item 3, a first long-chain profile: one training step on the real model at a 1,024-token
# budget, GRPO and RREDCoT on the same batch (same seed: step 1 samples identically), HF backend
set -uo pipefail
cd /work/main
export OMP_NUM_THREADS=1
common="model=smollm2-135m-instruct benchmark=gsm8k sampling.max_new_tokens=1024 train.prompts_per_step=4 sampling.n=4 train.steps=1 train.eval_every=0 train.eval_problems=1 train.eval_samples=1 seed=0"
for m in grpo rredcot; do
  echo "$m start $(date -u) $(cat /proc/loadavg)"
  /usr/bin/time -v .venv/bin/rredcot train $common method=$m run.dir=/work/tmp/long/$m > /work/tmp/long/$m.log 2>&1
  echo "$m rc=$? end $(date -u) $(cat /proc/loadavg)"
done
