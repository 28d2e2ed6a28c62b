"""The shell scripts under scripts/ and bench/ never write into the committed results/ unless told
to (their defaults go under runs/ or their work folder), and the ones that train resume an
unfinished run instead of starting it over. The train and report commands are replaced by a
stand-in that records its arguments (and marks a run finished), so the script's own logic runs in
seconds."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*REPO.glob("scripts/**/*.sh"), *REPO.glob("scripts/**/*.sbatch"), *REPO.glob("bench/*.sh")])

# Records each call, as `rredcot ARGS...` would be called; `train` marks its run.dir finished,
# `report` makes its --out folder.
STAND_IN = r"""#!/bin/bash
[[ $1 == -m ]] && shift 2  # called as `python -m rredcot_cli ...`
echo "$*" >>"$CALLS"
if [[ $1 == train ]]; then
  for arg in "$@"; do [[ $arg == run.dir=* ]] && dir=${arg#run.dir=}; done
  mkdir -p "$dir/train" && echo '{"status": "complete"}' >"$dir/train/manifest.json"
elif [[ $1 == report ]]; then
  while [[ $# -gt 0 && $1 != --out ]]; do shift; done
  mkdir -p "$2"
fi
"""


def default_paths(script: Path) -> dict[str, str]:
    """``NAME=${NAME:-default}`` and ``${1:-default}`` in ``script``: the value used when unset."""
    text = script.read_text()
    found = {name: value for name, value in re.findall(r"^\s*(\w+)=\$\{\1:?-([^}]*)\}", text, flags=re.M)}
    found.update({f"${n}": value for n, value in re.findall(r"\$\{(\d):?-([^}]*)\}", text)})
    return found


def test_there_are_scripts_to_check():
    assert {"compare_methods.sh", "ladder.sh", "real_model_memory.sh", "real_model_study.sh"} <= {
        s.name for s in SCRIPTS}


# Defaults that name a committed file the script only reads (the registered protocol of
# scripts/where_credit_pays.sh), never one it writes.
READ_ONLY_DEFAULTS = {("where_credit_pays.sh", "PROTOCOL")}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: str(s.relative_to(REPO)))
def test_no_script_writes_into_results_by_default(script):
    writes_into_results = {name: value for name, value in default_paths(script).items()
                           if re.search(r"(^|[\s/\"'])results/", value)
                           and (script.name, name) not in READ_ONLY_DEFAULTS}
    assert not writes_into_results, f"{script.name}: defaults into the committed results/: {writes_into_results}"


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    stand_in, calls = tmp_path / "rredcot-stand-in", tmp_path / "calls"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    return stand_in, calls


def _unfinished(run: Path) -> None:
    (run / "train").mkdir(parents=True)
    (run / "train" / "manifest.json").write_text(json.dumps({"status": "running"}))


def _run(script: str, tmp_path: Path, *args: str, **env: str) -> list[str]:
    calls = tmp_path / "calls"
    environment = {**os.environ, "CALLS": str(calls), "OMP_NUM_THREADS": "1", **env}
    result = subprocess.run(["bash", str(REPO / script), *args], cwd=tmp_path, env=environment,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return calls.read_text().splitlines()


def test_compare_methods_resumes_unfinished_runs_and_reports_under_runs(tmp_path):
    stand_in, _ = _stand_in(tmp_path)
    _unfinished(tmp_path / "runs/compare/grpo-seed0")
    calls = _run("scripts/compare_methods.sh", tmp_path, RREDCOT=str(stand_in), METHODS="grpo", SEEDS="0 1",
                 PYTHON=sys.executable)
    trains = [c for c in calls if c.startswith("train ")]
    assert trains == ["train method=grpo seed=0 run.dir=runs/compare/grpo-seed0 train.resume=true",
                      "train method=grpo seed=1 run.dir=runs/compare/grpo-seed1"]
    assert calls[-1].endswith("--out runs/compare-report")
    assert (tmp_path / "runs/compare-report/compare_methods.txt").is_file()
    assert not (tmp_path / "results").exists()


def test_real_model_study_resumes_unfinished_runs(tmp_path):
    stand_in, _ = _stand_in(tmp_path)
    _unfinished(tmp_path / "runs/real-model/grpo-lr1e-5-seed0")
    calls = _run("scripts/real_model_study.sh", tmp_path, "study", PYTHON=str(stand_in), LR="1e-5", SEEDS="0 1",
                 METHODS="grpo")
    assert [c.split("run.dir=")[1] for c in calls] == ["runs/real-model/grpo-lr1e-5-seed0 train.resume=true",
                                                       "runs/real-model/grpo-lr1e-5-seed1"]
    assert not any("run.overwrite=true" in c for c in calls)


BENCH_SCRIPTS = sorted((REPO / "bench").glob("*.py"))


@pytest.mark.parametrize("script", BENCH_SCRIPTS, ids=lambda s: s.name)
def test_no_bench_script_writes_into_results_by_default(script):
    """A bench run without --out writes under runs/bench/, not over the committed figures; updating
    those takes an explicit --out results/... (issue 38 item 5)."""
    text = script.read_text()
    defaults = re.findall(r"add_argument\(\s*\"--out\"[^)]*default=([^,)]+(?:\([^)]*\))?[^,)]*)", text)
    assert not [d for d in defaults if "results" in d], f"{script.name}: --out defaults into results/: {defaults}"
