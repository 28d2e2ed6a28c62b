#!/usr/bin/env bash
# The 3-step timing behind setting B-smollm2's CPU budget (before its registration). Run from the
# repository root; one torch thread, as the study runs. Output: runs/prereg-timing-smollm2/; the committed
# copies beside this file are those train/ folders without checkpoints, and the two logs.
set -euo pipefail
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p runs/prereg-timing-smollm2
budget=(model=smollm2-135m-instruct model.chat_template=false benchmark=arith_multiline segment=newline
        sampling.n=8 sampling.temperature=1.0 sampling.max_new_tokens=96 train.prompts_per_step=4
        train.updates_per_batch=1 train.minibatch_size=32 train.eval_problems=39 train.eval_samples=4)
for m in grpo rredcot; do
  /usr/bin/time -v python -m rredcot_cli train "${budget[@]}" method=$m train.steps=3 train.eval_every=3 \
    train.save_every=0 train.lr=1e-5 seed=0 train.data_order_seed=0 run.dir=runs/prereg-timing-smollm2/$m \
    run.overwrite=true > runs/prereg-timing-smollm2/$m.log 2>&1
done
