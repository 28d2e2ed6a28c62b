#!/usr/bin/env bash
# Peak RSS of `rredcot train` on SmolLM2-135M-Instruct (arith, 8 prompts x 4 samples, <= 128 new
# tokens, 2 steps, seed 0, one torch thread) under the memory options of docs/studies/real-model-speed.md,
# against the floor of weights + gradients + AdamW moments (16 B per parameter in fp32).
#
#   bench/real_model_memory.sh [WORK]           # runs every config, then writes the JSON
#   COLLECT_ONLY=1 bench/real_model_memory.sh [WORK]   # only (re)writes the JSON from WORK
#
# Peak RSS does not depend on the machine's load; the seconds in the JSON do (label them busy).
# Output: $OUT, default WORK/memory_options.json (the committed results/real-model-speed/memory_options.json
# is rewritten only when OUT names it), with peak RSS, ratio to the floor, user/system
# CPU seconds, per-step phase seconds, and whether the metrics and final weights equal the
# baseline's bit for bit).
set -euo pipefail
WORK=${1:-/tmp/real-model-memory}
PYTHON=${PYTHON:-python}
OUT=${OUT:-$WORK/memory_options.json}
BASE=(model=smollm2-135m-instruct benchmark=arith train.prompts_per_step=8 sampling.n=4 sampling.max_new_tokens=128
      method=grpo train.steps=2 train.eval_every=0 train.eval_problems=2 train.eval_samples=1 train.save_every=0
      seed=0 backend.num_threads=1 run.overwrite=true)
GLIBC=(MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072)  # a fixed mmap threshold: freed blocks go back to the OS
CONFIGS=(  # name | environment | overrides
  "baseline||"
  "malloc|${GLIBC[*]}|"
  "mbt512||train.micro_batch_tokens=512"
  "gc||train.gradient_checkpointing=true"
  "gc_malloc|${GLIBC[*]}|train.gradient_checkpointing=true"
)
mkdir -p "$WORK"
if [[ -z ${COLLECT_ONLY:-} ]]; then
  for c in "${CONFIGS[@]}"; do
    IFS='|' read -r name envs extra <<< "$c"
    # shellcheck disable=SC2086  # envs and extra are word lists
    env $envs OMP_NUM_THREADS=1 /usr/bin/time -v "$PYTHON" -m rredcot_cli train "${BASE[@]}" $extra \
      run.dir="$WORK/$name" > "$WORK/$name.log" 2>&1
  done
fi
"$PYTHON" - "$WORK" "$OUT" "${CONFIGS[@]}" <<'PY'
import hashlib, json, pathlib, re, sys
import pyarrow.parquet as pq

work, out, configs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
timing = re.compile(r"(sec|time|per_s)")
params = 134_515_008  # SmolLM2-135M-Instruct (docs/studies/real-model-speed.md)
floor = 16 * params
rows, base = [], None
for c in configs:
    name, envs, extra = c.split("|")
    log = (work / f"{name}.log").read_text()
    grab = lambda label: float(re.search(rf"{label}: ([\d.]+)", log).group(1))
    metrics = pq.read_table(work / name / "train" / "metrics.parquet").to_pylist()
    numbers = [{k: v for k, v in r.items() if not timing.search(k)} for r in metrics]
    weights = hashlib.sha256((work / name / "train/checkpoints/final/model.safetensors").read_bytes()).hexdigest()
    base = base or (numbers, weights)
    rss = grab(r"Maximum resident set size \(kbytes\)") * 1024
    rows.append({"config": name, "environment": envs, "overrides": extra, "peak_rss_gib": rss / 2**30,
                 "rss_over_floor": rss / floor, "user_cpu_s": grab(r"User time \(seconds\)"),
                 "system_cpu_s": grab(r"System time \(seconds\)"),
                 "steps": [{k: r[k] for k in ("step", "seconds_sampling", "seconds_update", "tokens")} for r in metrics],
                 "metrics_equal_baseline": numbers == base[0], "weights_equal_baseline": weights == base[1]})
out.write_text(json.dumps({"floor_gib": floor / 2**30, "params": params, "load": "busy (2 cores shared with other jobs)",
                           "configs": rows}, indent=1) + "\n")
for r in rows:
    print(f"{r['config']:10s} {r['peak_rss_gib']:.2f} GiB {r['rss_over_floor']:.2f}x  user {r['user_cpu_s']:.0f} s  "
          f"sys {r['system_cpu_s']:.0f} s  same numbers {r['metrics_equal_baseline']}  same weights {r['weights_equal_baseline']}")
PY
