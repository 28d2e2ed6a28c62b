"""scripts/slurm/sweep.sbatch on this machine: a stand-in `sbatch` first on PATH runs each job at
once (an array's tasks one after another, with SLURM_ARRAY_TASK_ID set), so the script submits a
2 methods x 2 seeds grid of tiny `rredcot train` runs and the dependent report job, all here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "scripts" / "slurm" / "sweep.sbatch"
REPORT = REPO / "scripts" / "slurm" / "sweep_report.sbatch"
TINY = ["benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=2", "sampling.max_new_tokens=16",
        "train.steps=1", "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=0",
        "train.eval_problems=2", "train.eval_samples=2", "train.save_every=0"]

FAKE_SBATCH = r"""#!/bin/bash
# Stand-in for sbatch: runs the job now; an array's tasks one after another. Logs the submissions.
array=""; parsable=0; dependency=""
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    --array=*) array=${1#--array=} ;;
    --parsable) parsable=1 ;;
    --dependency=*) dependency=${1#--dependency=} ;;
  esac
  shift
done
script=$1; shift
id=$(( $(cat "$FAKE_SLURM/count" 2>/dev/null || echo 4200) + 1 ))
echo "$id" >"$FAKE_SLURM/count"
echo "job $id: $(basename "$script") array=$array dependency=$dependency" >>"$FAKE_SLURM/submitted"
if [[ -n $array ]]; then
  range=${array%%\%*}
  for ((i = ${range%-*}; i <= ${range#*-}; i++)); do
    SLURM_JOB_ID=$id SLURM_ARRAY_JOB_ID=$id SLURM_ARRAY_TASK_ID=$i bash "$script" "$@" \
      >"$FAKE_SLURM/$id-$i.out" 2>&1 || echo "task $i of job $id failed" >>"$FAKE_SLURM/submitted"
  done
else
  SLURM_JOB_ID=$id bash "$script" "$@" >"$FAKE_SLURM/$id.out" 2>&1 || echo "job $id failed" >>"$FAKE_SLURM/submitted"
fi
if ((parsable)); then echo "$id"; else echo "Submitted batch job $id"; fi
"""


def _env(tmp_path, **extra):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    slurm = tmp_path / "slurm"
    slurm.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
               FAKE_SLURM=str(slurm), OMP_NUM_THREADS="1", METHODS="grpo dr_grpo", SEEDS="0 1",
               SWEEP_DIR=str(tmp_path / "sweep"), **extra)
    return env


def test_the_sweep_array_trains_a_grid_and_reports_it(tmp_path):
    env = _env(tmp_path)
    process = subprocess.run(["bash", str(SWEEP), *TINY], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
    slurm = tmp_path / "slurm"
    logs = "".join(p.read_text() for p in sorted(slurm.glob("*.out")))
    assert process.returncode == 0, process.stdout + process.stderr + logs[-3000:]
    assert "submitted 4 cells (2 methods x 2 seeds) as array job 4201, report as job 4202" in process.stdout
    assert (slurm / "submitted").read_text().splitlines() == [
        "job 4201: sweep.sbatch array=0-3 dependency=",
        "job 4202: sweep_report.sbatch array= dependency=afterany:4201",
    ]
    sweep = tmp_path / "sweep"
    # SLURM_ARRAY_TASK_ID -> (method, seed): methods outer, seeds inner.
    for task, (method, seed) in enumerate([("grpo", 0), ("grpo", 1), ("dr_grpo", 0), ("dr_grpo", 1)]):
        train = sweep / f"{method}-seed{seed}" / "train"
        assert json.loads((train / "manifest.json").read_text())["status"] == "complete"
        config = yaml.safe_load((train / "config.yaml").read_text())
        assert (config["method"]["name"], config["seed"], config["train"]["steps"]) == (method, seed, 1)
        assert f"cell {task} of 4: method={method} seed={seed}" in (slurm / f"4201-{task}.out").read_text()
    report = (sweep / "report" / "report.md").read_text()
    assert "4 training runs in 2 groups" in report and "Left out" not in report

    # A cell that did not finish (here: its manifest says running) is left out by the report step.
    manifest = sweep / "dr_grpo-seed1" / "train" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "status": "running"}))
    process = subprocess.run(["bash", str(REPORT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    assert f"skipping 1 unfinished run dir(s) (train did not finish): {sweep / 'dr_grpo-seed1'}" in process.stderr
    assert "3 training runs in 2 groups" in (sweep / "report" / "report.md").read_text()


def test_the_sweep_script_refuses_a_task_outside_the_grid_and_sbatch_itself(tmp_path):
    env = _env(tmp_path, SLURM_ARRAY_TASK_ID="4", SLURM_JOB_ID="1")
    process = subprocess.run(["bash", str(SWEEP)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert process.returncode == 2
    assert "SLURM_ARRAY_TASK_ID=4 is outside the grid of 4 cells" in process.stderr
    env = _env(tmp_path, SLURM_JOB_ID="1")
    process = subprocess.run(["bash", str(SWEEP)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert process.returncode == 2 and "run it with bash" in process.stderr
    env = _env(tmp_path)
    del env["SWEEP_DIR"]
    process = subprocess.run(["bash", str(SWEEP)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert process.returncode != 0 and "set SWEEP_DIR" in process.stderr
    assert not (tmp_path / "slurm" / "submitted").exists()
