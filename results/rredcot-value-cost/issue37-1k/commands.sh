#!/usr/bin/env bash
# Issue 37, item 4: the real-model default estimator's cost next to sampling at long completions.
# SmolLM2-135M-Instruct on GSM8K, 4 test prompts x 4 samples, up to 1,024 new tokens, seed 0, HF
# sampling, one thread; the machine was busy (six to eight other jobs on its two cores).
set -euo pipefail
export OMP_NUM_THREADS=1
R=runs/cost-1k
common="run.dir=$R seed=0 model=smollm2-135m-instruct benchmark=gsm8k sampling.max_new_tokens=1024"
/usr/bin/time -v rredcot sample $common sample.num_prompts=4 sampling.n=4          # sample/manifest.json: seconds
rredcot segment $common
/usr/bin/time -v rredcot attribute $common method=rredcot method.value=answer_probe run.tag=answer-probe
# value estimation / sampling = attribute-answer-probe/rredcot/manifest.json seconds / sample/manifest.json seconds
