#!/bin/bash
# Issue 39, 2026-12-07: a committed sweep run of setting A remade on another machine, to see whether a run
# lost with a machine is remade bit for bit (it is not: docs/failure-modes.md, Determinism).
# Run from a checkout at the run's pinned commit 4fc0b6f with its package first on PYTHONPATH; then
#   python scripts/same_run.py --no-weights results/where-credit-pays/A/sweep/grpo/grpo-lr3e-05-seed100 \
#       results/where-credit-pays/cross-machine/grpo-lr3e-05-seed100
# The committed folder leaves out train/checkpoints (99 MB), as the study's runs do.
mkdir -p runs/cross-machine
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/time -v python -m rredcot_cli train model=tiny benchmark=chain benchmark.min_steps=14 benchmark.max_steps=20 segment=newline sampling.n=8 sampling.temperature=1.0 sampling.max_new_tokens=224 train.steps=60 train.prompts_per_step=8 train.updates_per_batch=2 train.minibatch_size=32 train.eval_every=10 train.eval_problems=128 train.eval_samples=4 train.save_every=10 method.scale_by_std=true method=grpo train.lr=3e-05 seed=100 train.resume=true train.data_order_seed=100 run.dir=runs/cross-machine/grpo-lr3e-05-seed100 > runs/cross-machine/grpo-lr3e-05-seed100.log 2>&1
