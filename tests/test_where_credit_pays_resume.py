"""scripts/where_credit_pays_resume.sh restarts the study's drivers at their pinned commits, with the
committed runs put back first, and keeps finished runs; checked through its dry run (nothing is
started, no worktree is made, nothing is committed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "where_credit_pays_resume.sh"
RUN_LOG = ROOT / "results" / "where-credit-pays" / "run-log.md"


def resume(*args: str, worktrees: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "WORKTREES": str(worktrees), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=60)


def pinned_in_script() -> dict[str, str]:
    line = re.search(r"^declare -A PINNED=\((.*)\)$", SCRIPT.read_text(), re.M).group(1)
    return dict(re.findall(r"\[([\w-]+)\]=(\w+)", line))


def test_the_pins_are_the_run_logs():
    header = re.search(r"For each setting \((.*?)\), from the main checkout", RUN_LOG.read_text(), re.S).group(1)
    logged = dict((name, commit) for name, commit in re.findall(r"([\w-]+) at (\w+)", header))
    assert pinned_in_script() == logged == {"A": "4fc0b6f", "B-embedded": "f2afc38", "B-smollm2": "bc2bbbf"}


def test_start_makes_the_worktree_at_the_pin_puts_runs_back_then_starts_driver_and_keeper(tmp_path):
    result = resume("start", "A", worktrees=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    worktree = tmp_path / "A"
    expected_order = [
        "scripts/study_machine.py results/where-credit-pays/machines.csv",
        f"git worktree add --detach {worktree} 4fc0b6f",
        f"scripts/keep_finished_runs.py results/where-credit-pays/A {worktree}/results/where-credit-pays/A",
        "scripts/where_credit_pays.sh A",
        "keep >>",
    ]
    positions = [next(i for i, line in enumerate(lines) if step in line) for step in expected_order]
    assert positions == sorted(positions), result.stdout
    driver = next(line for line in lines if "scripts/where_credit_pays.sh A" in line)
    assert f"cd {worktree} " in driver and f"PYTHONPATH={worktree} " in driver
    assert "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 RESULTS=results/where-credit-pays" in driver
    assert f"PYTHON={sys.executable}" in driver and f">> {tmp_path}/logs/A.log" in driver
    assert not worktree.exists() and not (tmp_path / "logs").exists()


def test_committed_runs_are_put_back_only_where_there_are_some(tmp_path):
    for setting in pinned_in_script():
        result = resume("start", setting, worktrees=tmp_path)
        assert result.returncode == 0, result.stderr
        committed = (ROOT / "results" / "where-credit-pays" / setting).is_dir()
        assert ("keep_finished_runs.py" in result.stdout) == committed, (setting, result.stdout)
        assert f"scripts/where_credit_pays.sh {setting} >>" in result.stdout


def test_a_worktree_at_another_commit_is_refused_in_one_line(tmp_path):
    other = tmp_path / "B-embedded"
    other.mkdir()
    git = ["git", "-C", str(other), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "not the pin"], check=True)
    result = resume("start", "B-embedded", worktrees=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "not B-embedded's pinned f2afc38" in result.stderr
    assert "where_credit_pays.sh" not in result.stdout


def test_an_unknown_setting_or_none_is_one_line_naming_the_pinned_ones(tmp_path):
    for args in (["start", "C"], ["start"], ["restart"]):
        result = resume(*args, worktrees=tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (args, result.stderr)
        assert "git worktree" not in result.stdout
    assert all(name in resume("start", "C", worktrees=tmp_path).stderr for name in pinned_in_script())


def test_keep_copies_and_commits_only_the_settings_with_a_worktree(tmp_path):
    (tmp_path / "B-embedded" / "results" / "where-credit-pays" / "B-embedded").mkdir(parents=True)
    result = resume("keep", worktrees=tmp_path)
    assert result.returncode == 0, result.stderr
    copies = [line for line in result.stdout.splitlines() if "keep_finished_runs.py" in line]
    assert copies == [f"nice {sys.executable} scripts/keep_finished_runs.py "
                      f"{tmp_path}/B-embedded/results/where-credit-pays/B-embedded results/where-credit-pays/B-embedded "]
    assert [line for line in result.stdout.splitlines() if line.startswith("git commit")] == [
        "git commit -q -m where-credit-pays\\ B-embedded:\\ finished\\ runs\\ as\\ they\\ finish -- "
        "results/where-credit-pays/B-embedded "]


def test_status_counts_finished_runs_and_names_the_unfinished_from_manifests_only(tmp_path):
    study = tmp_path / "A" / "results" / "where-credit-pays" / "A"
    for run, status in [("runs/grpo-lr3e-05-seed0", "complete"), ("runs/rredcot-lr3e-05-seed0", "running"),
                        ("sweep/grpo/grpo-lr1e-05-seed100", "complete"),
                        ("runs/grpo-lr3e-05-seed0/train/rollouts/step-10", "running")]:  # a part of a run, not a run
        (study / run / "train").mkdir(parents=True, exist_ok=True)
        (study / run / "train" / "manifest.json").write_text(f'{{"status": "{status}"}}')
    result = resume("status", worktrees=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "A: no driver running" and lines[-1] == "  finished runs: 2"
    unfinished = [line for line in lines if "in flight or stopped" in line]
    assert len(unfinished) == 1 and f"{study}/runs/rredcot-lr3e-05-seed0 (manifest last written" in unfinished[0]


def test_finish_keeps_finished_runs_then_commits_each_drivers_log_under_this_machines_name(tmp_path):
    (tmp_path / "A" / "results" / "where-credit-pays" / "A").mkdir(parents=True)
    (tmp_path / "logs").mkdir()
    for name in ["A.log", "keep.log"]:
        (tmp_path / "logs" / name).write_text("a line\n")
    result = resume("finish", worktrees=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    machine = (ROOT / "results" / "where-credit-pays" / "machines.csv").read_text().splitlines()[-1].split(",")[0]
    copy = f"results/where-credit-pays/driver-logs/{machine}-A.log"
    assert f"cp {tmp_path}/logs/A.log {copy} " in lines and f"git add -- {copy} " in lines
    assert not any("keep.log" in line for line in lines)  # the keeping loop's log is not a driver's
    steps = ["keep_finished_runs.py", f"cp {tmp_path}/logs/A.log", "git commit -q -m where-credit-pays:\\ the\\ drivers",
             "A: no driver running"]
    positions = [next(i for i, line in enumerate(lines) if step in line) for step in steps]
    assert positions == sorted(positions), result.stdout


def test_a_keeping_pass_commits_finished_runs_and_survives_a_busy_index(tmp_path):
    """Run for real in a small repository of its own: a held index lock (a commit made by hand at that
    moment) costs one pass, not the loop; the next pass copies the finished run and commits it."""
    repo, worktrees = tmp_path / "repo", tmp_path / "worktrees"
    (repo / "scripts").mkdir(parents=True)
    for name in ["where_credit_pays_resume.sh", "keep_finished_runs.py"]:
        (repo / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    (repo / "results" / "where-credit-pays" / "A").mkdir(parents=True)
    (repo / "results" / "where-credit-pays" / "A" / ".gitkeep").write_text("")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    run = worktrees / "A" / "results" / "where-credit-pays" / "A" / "runs" / "grpo-lr3e-05-seed0" / "train"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"status": "complete"}')
    env = {**os.environ, "PYTHON": sys.executable, "WORKTREES": str(worktrees), "ONCE": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env.pop("DRY_RUN", None)

    def keep_pass() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "scripts/where_credit_pays_resume.sh", "keep"], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=60)

    lock = repo / ".git" / "index.lock"
    lock.write_text("")
    busy = keep_pass()
    assert busy.returncode == 0 and "git add failed; the next pass tries again" in busy.stdout, busy.stdout + busy.stderr
    lock.unlink()
    assert keep_pass().returncode == 0
    log = subprocess.run([*git, "log", "--format=%s", "--name-only", "-1"], capture_output=True, text=True).stdout
    assert log.startswith("where-credit-pays A: finished runs as they finish (1 kept so far")
    assert "results/where-credit-pays/A/runs/grpo-lr3e-05-seed0/train/manifest.json" in log


def test_a_setting_with_nothing_finished_yet_is_no_failure(tmp_path):
    """A driver just started (its worktree has only an unfinished run) gives nothing to copy, and so no
    folder to add: the pass says so instead of reporting a failed `git add`."""
    repo, worktrees = tmp_path / "repo", tmp_path / "worktrees"
    (repo / "scripts").mkdir(parents=True)
    for name in ["where_credit_pays_resume.sh", "keep_finished_runs.py"]:
        (repo / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "start"], check=True)
    run = worktrees / "B-smollm2" / "results" / "where-credit-pays" / "B-smollm2" / "sweep" / "grpo" / "grpo-lr3e-06-seed100" / "train"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text('{"status": "running"}')
    env = {**os.environ, "PYTHON": sys.executable, "WORKTREES": str(worktrees), "ONCE": "1"}
    env.pop("DRY_RUN", None)
    result = subprocess.run(["bash", "scripts/where_credit_pays_resume.sh", "keep"], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "failed" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert "B-smollm2: 0 finished runs of 1" in result.stdout
