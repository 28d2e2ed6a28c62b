#!/usr/bin/env bash
# Peak RSS of `rredcot train` on SmolLM2-135M-Instruct under the memory options of
# docs/studies/real-model-speed.md, against the floor of weights + gradients + AdamW moments (16 B per
# parameter in fp32), seed 0, one torch thread, at two shapes (SHAPE):
#   short  issue 27's (default): arith, 8 prompts x 4 samples, <= 128 new tokens, 2 steps
#   long   long chains: arith with "explain your reasoning step by step", 4 prompts x 4 samples,
#          <= 1,024 new tokens, 1 step
#
#   bench/real_model_memory.sh [WORK]                         # every config at SHAPE, then the JSON
#   SHAPE=long CONFIGS="baseline gc" bench/real_model_memory.sh [WORK]     # some configs
#   CODE=/tmp/main TAG=_before CONFIGS=baseline bench/real_model_memory.sh [WORK]   # another checkout's
#       rredcot_cli (PYTHONPATH=CODE; give it the symlink CODE/rredcot_cli/conf -> ../conf): a "before"
#   COLLECT_ONLY=1 bench/real_model_memory.sh [WORK]          # only (re)write the JSON from WORK
#
# A run is named SHAPE_CONFIG[TAG] (WORK/NAME.log, WORK/NAME/); the JSON has every run in WORK. Peak
# RSS does not depend on the machine's load; the seconds do: every run records the load average
# around it and is labelled busy above 1.15 (one core for itself, 2 cores here).
# Output: $OUT, default WORK/memory_options.json (the committed results/real-model-speed/*.json are
# rewritten only when OUT names one), per run: its command, commit, seed, load, peak RSS, ratio to the
# floor, user/system CPU seconds, per-step phase seconds, and whether the metrics (every column but
# timings) and final weights equal those of SHAPE_baseline_before (else SHAPE_baseline) bit for bit.
set -euo pipefail
WORK=${1:-/tmp/real-model-memory}
PYTHON=${PYTHON:-python}
OUT=${OUT:-$WORK/memory_options.json}
SHAPE=${SHAPE:-short}
BASE=(model=smollm2-135m-instruct benchmark=arith method=grpo train.eval_every=0 train.eval_problems=2
      train.eval_samples=1 train.save_every=0 seed=0 backend.num_threads=1 run.overwrite=true)
case $SHAPE in
  short) BASE+=(train.prompts_per_step=8 sampling.n=4 sampling.max_new_tokens=128 train.steps=2) ;;
  long) BASE+=(train.prompts_per_step=4 sampling.n=4 sampling.max_new_tokens=1024 train.steps=1
               "benchmark.prompt_template='{question} Explain your reasoning step by step in detail, then give the final answer.'") ;;
  *) echo "SHAPE=$SHAPE: use short or long" >&2; exit 2 ;;
esac
# glibc's fixed mmap threshold: freed blocks go back to the OS. Since the train stage sets it itself
# (rredcot_cli/train/memory.py), "malloc" equals "baseline" there; before, it was an environment variable.
# Since train.gradient_checkpointing=auto (issue 42 item 1), "gc" equals "baseline" on both shapes.
GLIBC=(MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=131072)
declare -A ENVS=([baseline]="" [malloc]="${GLIBC[*]}" [mbt512]="" [gc]="" [gc_malloc]="${GLIBC[*]}")
declare -A EXTRA=([baseline]="" [malloc]="" [mbt512]="train.micro_batch_tokens=512"
                  [gc]="train.gradient_checkpointing=true" [gc_malloc]="train.gradient_checkpointing=true")
CONFIGS=${CONFIGS:-baseline malloc mbt512 gc gc_malloc}
mkdir -p "$WORK"
if [[ -z ${COLLECT_ONLY:-} ]]; then
  for config in $CONFIGS; do
    [[ -v "EXTRA[$config]" ]] || { echo "CONFIGS: unknown config $config (${!EXTRA[*]})" >&2; exit 2; }
    name=${SHAPE}_${config}${TAG:-}
    start=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086  # the environment and the extra overrides are word lists
    env ${ENVS[$config]} OMP_NUM_THREADS=1 ${CODE:+PYTHONPATH=$CODE} /usr/bin/time -v "$PYTHON" -m rredcot_cli train \
      "${BASE[@]}" ${EXTRA[$config]} run.dir="$WORK/$name" > "$WORK/$name.log" 2>&1
    printf '{"loadavg_start": %s, "loadavg_end": %s}\n' "$start" "$(cut -d' ' -f1 /proc/loadavg)" > "$WORK/$name.load.json"
  done
fi
"$PYTHON" - "$WORK" "$OUT" <<'PY'
import hashlib, json, pathlib, re, sys
import pyarrow.parquet as pq

work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
timing = re.compile(r"(sec|time|per_s)")
params = 134_515_008  # SmolLM2-135M-Instruct (docs/studies/real-model-speed.md)
floor = 16 * params
BUSY = 1.15  # load average above one core for the run itself


def numbers_and_weights(run: pathlib.Path):
    metrics = pq.read_table(run / "train" / "metrics.parquet").to_pylist()
    numbers = [{k: v for k, v in r.items() if not timing.search(k)} for r in metrics]
    # final/, or the last step's checkpoint of a run stopped (SIGTERM) after its last step
    saved = sorted((run / "train/checkpoints").glob("*/model.safetensors"))
    final = run / "train/checkpoints/final/model.safetensors"
    weights = hashlib.sha256((final if final.exists() else saved[-1]).read_bytes()).hexdigest()
    return metrics, numbers, weights


rows = []
for log_path in sorted(work.glob("*.log")):
    name, run = log_path.stem, work / log_path.stem
    if not (run / "train" / "metrics.parquet").exists():
        continue
    log = log_path.read_text()
    grab = lambda label: float(re.search(rf"{label}: ([\d.]+)", log).group(1))
    command = re.search(r'Command being timed: "(.*)"', log).group(1)
    shape = "long" if "sampling.max_new_tokens=1024" in command else "short"
    metrics, numbers, weights = numbers_and_weights(run)
    manifest = json.loads((run / "train" / "manifest.json").read_text())
    load_file = work / f"{name}.load.json"
    load = json.loads(load_file.read_text()) if load_file.exists() else {}
    busy = max((v for k, v in load.items() if k.startswith("loadavg")), default=None)
    reference = next((work / n for n in (f"{shape}_baseline_before", f"{shape}_baseline")
                      if (work / n / "train" / "metrics.parquet").exists() and n != name), None)
    _, ref_numbers, ref_weights = numbers_and_weights(reference) if reference else (None, None, None)
    rss = grab(r"Maximum resident set size \(kbytes\)") * 1024
    rows.append({"run": name, "shape": shape, "command": command, "commit": manifest.get("git", {}).get("sha"),
                 "seed": manifest.get("seed", 0), "load": load,
                 "busy": "busy" if busy is None or busy > BUSY else "quiet",
                 "peak_rss_gib": rss / 2**30, "rss_over_floor": rss / floor,
                 "user_cpu_s": grab(r"User time \(seconds\)"), "system_cpu_s": grab(r"System time \(seconds\)"),
                 "wall": re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log).group(1),
                 "minor_page_faults": int(grab(r"Minor \(reclaiming a frame\) page faults")),
                 # the hint of 7e5b986; since issue 42 item 1, the line of train.gradient_checkpointing=auto
                 "hint_printed": "train.gradient_checkpointing=true would" in log,
                 "checkpointing_auto_on": "gradient checkpointing on (train.gradient_checkpointing=auto)" in log,
                 "stopped_after_last_step": "stopped after step" in log,
                 "steps": [{k: r.get(k) for k in ("step", "seconds_sampling", "seconds_update", "tokens",
                                                  "response_tokens_mean")} for r in metrics],
                 "compared_with": reference and reference.name,
                 "metrics_equal": reference and numbers == ref_numbers,
                 "weights_equal": reference and weights == ref_weights})
out.write_text(json.dumps({"floor_gib": floor / 2**30, "params": params, "runs": rows}, indent=1) + "\n")
for r in rows:
    print(f"{r['run']:28s} {r['peak_rss_gib']:.2f} GiB {r['rss_over_floor']:.2f}x  user {r['user_cpu_s']:.0f} s  "
          f"sys {r['system_cpu_s']:.0f} s  {r['busy']}  same as {r['compared_with']}: numbers {r['metrics_equal']}, "
          f"weights {r['weights_equal']}")
PY
