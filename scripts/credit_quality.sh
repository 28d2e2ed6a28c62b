#!/usr/bin/env bash
# Credit quality with intervals (docs/studies/credit-quality.md): sample a batch of prompts once, segment
# it, and judge every credit method on BATCHES independent batches of it (whole prompt groups),
# so every column of the table has a 95% interval over batches.
#
#   scripts/credit_quality.sh                                   # R1: the default chain setting
#   RUN=runs/cq-r4 EXTRA="model.path=runs/tiny-chain-long/sft/model benchmark.min_steps=80 \
#       benchmark.max_steps=90 sampling.max_new_tokens=784 backend=vllm" PROMPTS=10 K=8 scripts/credit_quality.sh
#
# Environment: RUN (run dir, default runs/credit-quality), PROMPTS (prompts, default 40), N
# (samples per prompt, 8), BATCHES (5), K (reference continuations per boundary, 16), RERUNS (3),
# SEED (0), EXTRA (overrides for every stage), PYTHON.
set -euo pipefail
PYTHON=${PYTHON:-python}
RUN=${RUN:-runs/credit-quality}
PROMPTS=${PROMPTS:-40}
N=${N:-8}
BATCHES=${BATCHES:-5}
K=${K:-16}
RERUNS=${RERUNS:-3}
SEED=${SEED:-0}
EXTRA=${EXTRA:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
started=$SECONDS
# shellcheck disable=SC2086  # EXTRA is a list of overrides
$PYTHON -m rredcot_cli sample run.dir="$RUN" seed="$SEED" sample.num_prompts="$PROMPTS" sampling.n="$N" $EXTRA
$PYTHON -m rredcot_cli segment run.dir="$RUN" seed="$SEED" $EXTRA
$PYTHON -m rredcot_cli judge run.dir="$RUN" seed="$SEED" judge.batches="$BATCHES" judge.reference_k="$K" \
    judge.reruns="$RERUNS" $EXTRA
echo "credit_quality.sh: $((SECONDS - started)) s"
