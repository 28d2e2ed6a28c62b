"""scripts/study_ledger.py lists every run of a study with its seconds, and totals them against the budget."""

import json
import re
from pathlib import Path

from repo_scripts import load_script

study_ledger = load_script("scripts/study_ledger.py")


def _run(study: Path, rel: str, status: str, seconds: float | None = None, cpu: float | None = None,
         restarts: int = 0, created: str = "2026-12-07T01:00:00+00:00") -> None:
    train = study / rel / "train"
    train.mkdir(parents=True)
    resumed = [{"at": "2026-12-07T04:25:58+00:00", "found": "running"}] * restarts
    (train / "manifest.json").write_text(json.dumps({
        "status": status, "git": {"sha": "4fc0b6f" + "0" * 33}, "created": created,
        "resumed": resumed}))
    if seconds is not None:
        (train / "summary.json").write_text(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "pass@1": 0.5}))
    rollout = train / "rollouts" / "step-10" / "train"  # a part of the run, never a run of its own
    rollout.mkdir(parents=True)
    (rollout / "manifest.json").write_text(json.dumps({"status": "complete"}))


def _study(tmp_path: Path) -> Path:
    study = tmp_path / "study"
    study.mkdir()
    (study / "protocol.json").write_text(json.dumps(
        {"settings": {"A": {"cpu_budget_core_hours": {"primary": 19, "total": 36}}}}))
    _run(study, "A/sweep/grpo/grpo-lr1e-05-seed100", "complete", 1800.0, 900.0)
    _run(study, "A/runs/grpo-lr3e-05-seed0", "complete", 3600.0, 2700.0, restarts=2)
    _run(study, "A/runs/rredcot-lr3e-05-seed0", "running")
    _run(study, "timing/grpo", "complete", 36.0, 18.0)
    return study


def test_lists_every_run_once_with_its_block_status_commit_and_seconds(tmp_path):
    entries = study_ledger.ledger(_study(tmp_path))
    assert [(e.setting, e.block, e.name, e.status, e.seconds, e.cpu_seconds, e.attempts) for e in entries] == [
        ("A", "runs", "grpo-lr3e-05-seed0", "complete", 3600.0, 2700.0, 3),
        ("A", "runs", "rredcot-lr3e-05-seed0", "running", None, None, 1),
        ("A", "sweep/grpo", "grpo-lr1e-05-seed100", "complete", 1800.0, 900.0, 1),
        ("timing", "", "grpo", "complete", 36.0, 18.0, 1),
    ]
    assert entries[0].commit.startswith("4fc0b6f")


def test_totals_in_core_hours_beside_the_registered_budget(tmp_path):
    study = _study(tmp_path)
    sums = study_ledger.totals(study_ledger.ledger(study), json.loads((study / "protocol.json").read_text()))
    assert sums == [
        {"setting": "A", "runs": 3, "complete": 2, "lost_attempts": 0, "wall_core_hours": 1.5, "cpu_hours": 1.0,
         "budget_primary": 19, "budget_total": 36},
        {"setting": "timing", "runs": 1, "complete": 1, "lost_attempts": 0, "wall_core_hours": 0.01, "cpu_hours": 0.01,
         "budget_primary": None, "budget_total": None},
    ]


def test_the_command_prints_both_tables_and_writes_the_json(tmp_path, capsys):
    study = _study(tmp_path)
    assert study_ledger.main([str(study), "--json", str(tmp_path / "ledger.json")]) == 0
    out = capsys.readouterr().out
    assert "| A | runs | rredcot-lr3e-05-seed0 | running | 4fc0b6f | 2026-12-07 01:00 |  | 1 |  |  |" in out
    assert "| A | runs | grpo-lr3e-05-seed0 | complete | 4fc0b6f | 2026-12-07 01:00 |  | 3 | 3,600 | 2,700 |" in out
    assert "different machines" not in out  # no machines.csv: no machine is known
    assert "| A | 3 | 2 | 0 | 1.50 | 1.00 | 19 / 36 |" in out
    assert "lost with their machine" not in out  # no lost_attempts.csv, no such table
    written = json.loads((tmp_path / "ledger.json").read_text())
    assert len(written["runs"]) == 4 and written["totals"][0]["cpu_hours"] == 1.0
    assert "pass@1" not in json.dumps(written)  # timings only: the ledger is no interim look


def test_a_missing_folder_is_one_clear_line(tmp_path, capsys):
    assert study_ledger.main([str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err


HEADER = "setting,block,run,state_when_last_seen,began_utc,last_seen_utc,lost_by_utc,run_log_entry\n"


def test_attempts_lost_with_a_machine_are_listed_and_counted_per_setting(tmp_path, capsys):
    study = _study(tmp_path)
    (study / "lost_attempts.csv").write_text(
        HEADER
        + "A,runs,grpo-lr3e-05-seed0,complete,,2026-12-07T00:09,2026-12-07T00:50,2026-12-07 00:50\n"
        + "B,sweep/grpo,grpo-lr1e-05-seed100,running,2026-12-07T10:42,2026-12-07T10:56,2026-12-07T11:29,"
          "2026-12-07 11:29\n")
    assert study_ledger.main([str(study), "--json", str(tmp_path / "ledger.json")]) == 0
    out = capsys.readouterr().out
    assert "| B | sweep/grpo | grpo-lr1e-05-seed100 | running | 2026-12-07 10:42 | 2026-12-07 10:56 | 2026-12-07 11:29 |" in out
    assert "| A | 3 | 2 | 1 | 1.50 | 1.00 | 19 / 36 |" in out
    assert "| B | 0 | 0 | 1 | 0.00 | 0.00 |  |" in out  # a setting whose only attempts were lost still gets its row
    written = json.loads((tmp_path / "ledger.json").read_text())
    assert [a["run"] for a in written["lost_attempts"]] == ["grpo-lr3e-05-seed0", "grpo-lr1e-05-seed100"]


def test_a_lost_attempts_file_with_other_columns_is_one_line_naming_the_header(tmp_path, capsys):
    study = _study(tmp_path)
    (study / "lost_attempts.csv").write_text("setting,run\nA,grpo-lr3e-05-seed0\n")
    assert study_ledger.main([str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and HEADER.strip() in err


def test_the_committed_lost_attempts_name_registered_runs_of_the_study():
    """Each row of results/where-credit-pays/lost_attempts.csv is a run the driver makes: a registered
    setting, an arm, a rate of its grid and a seed of the block; a run lost twice is listed twice."""
    study = Path(__file__).resolve().parents[1] / "results" / "where-credit-pays"
    protocol = json.loads((study / "protocol.json").read_text())
    lost = study_ledger.lost_attempts(study)
    assert lost
    assert [m["machine"] for m in study_ledger.machines(study)][0] == "before-2026-12-07"  # parses, in boot order
    for a in lost:
        setting = protocol["settings"][a.setting]
        arm, lr, seed = re.fullmatch(r"(\w+)-lr([\d.e-]+)-seed(\d+)", a.run).groups()
        assert arm in setting["arms"] and a.block in {"runs", f"sweep/{arm}"}, a
        seeds = setting["eval_seeds"] if a.block == "runs" else setting["lr_sweep"]["tuning_seeds"]
        assert float(lr) in setting["lr_sweep"]["lrs"] and int(seed) in seeds, a
        assert a.state_when_last_seen in {"complete", "running"} and a.last_seen_utc < a.lost_by_utc, a


MACHINES = ("machine,booted_utc,cpu,cores,torch_cpu_capability,run_log_entry\n"
            "old,,not recorded,2,not recorded,x\n"
            "b,2026-12-07T08:04,AMD EPYC,2,AVX512,y\n"
            "c,2026-12-07T11:27,AMD EPYC,2,AVX512,z\n")


def test_each_run_gets_the_machine_last_booted_before_it_and_split_pairs_are_listed(tmp_path, capsys):
    study = _study(tmp_path)  # its runs were created at 01:00, before machine b
    (study / "machines.csv").write_text(MACHINES)
    _run(study, "A/runs/grpo-lr3e-05-seed7", "complete", 500.0, 490.0, created="2026-12-07T10:30:00+00:00")
    _run(study, "A/runs/rredcot-lr3e-05-seed7", "complete", 510.0, 500.0, created="2026-12-07T11:29:59+00:00")
    _run(study, "A/runs/grpo-lr3e-05-seed8", "complete", 500.0, 490.0, created="2026-12-07T11:27:00+00:00")
    _run(study, "A/runs/rredcot-lr3e-05-seed8", "running", created="2026-12-07T11:40:00+00:00")
    machines = {e.name: e.machine for e in study_ledger.ledger(study)}
    assert machines == {"grpo-lr3e-05-seed0": "old", "rredcot-lr3e-05-seed0": "old", "grpo-lr1e-05-seed100": "old",
                        "grpo": "old", "grpo-lr3e-05-seed7": "b", "rredcot-lr3e-05-seed7": "c",
                        "grpo-lr3e-05-seed8": "c", "rredcot-lr3e-05-seed8": "c"}
    assert study_ledger.main([str(study), "--json", str(tmp_path / "ledger.json")]) == 0
    out = capsys.readouterr().out
    assert "- A, seed 7: grpo-lr3e-05-seed7 (b), rredcot-lr3e-05-seed7 (c)" in out
    assert "seed 8:" not in out and "seed 0:" not in out
    written = json.loads((tmp_path / "ledger.json").read_text())
    assert written["pairs_across_machines"] == [
        {"setting": "A", "seed": 7, "runs": ["grpo-lr3e-05-seed7 (b)", "rredcot-lr3e-05-seed7 (c)"]}]


def test_machines_out_of_boot_order_are_one_line(tmp_path, capsys):
    study = _study(tmp_path)
    lines = MACHINES.splitlines()
    (study / "machines.csv").write_text("\n".join([lines[0], lines[1], lines[3], lines[2]]) + "\n")
    assert study_ledger.main([str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in the order they were booted" in err


def test_what_is_left_is_projected_from_the_finished_runs_times_only(tmp_path, capsys):
    study = tmp_path / "study"
    study.mkdir()
    spec = {"status": "registered", "arms": {"grpo": [], "rredcot": []}, "eval_seeds": [0, 1, 2],
            "lr_sweep": {"lrs": [1e-5, 3e-5], "tuning_seeds": [100]}, "cpu_budget_core_hours": {"primary": 1, "total": 2}}
    (study / "protocol.json").write_text(json.dumps({"settings": {
        "A": spec, "B": {**spec, "arms": {"grpo": []}}, "C": {**spec, "status": "future"},
        "D": {**spec, "arms": {"grpo": []}}}}))
    for name, seconds in [("grpo-lr1e-05-seed100", 1000.0), ("grpo-lr3e-05-seed100", 2000.0),
                          ("rredcot-lr1e-05-seed100", 3000.0), ("rredcot-lr3e-05-seed100", 2000.0)]:
        _run(study, f"A/sweep/{name.split('-')[0]}/{name}", "complete", seconds, seconds)
    _run(study, "A/runs/grpo-lr3e-05-seed0", "complete", 3600.0, 3600.0)
    _run(study, "A/runs/rredcot-lr3e-05-seed0", "running")  # not finished: still left, and not timed
    _run(study, "A/runs/rloo-lr3e-05-seed0", "complete", 9999.0, 9999.0)  # a further arm: not a primary run
    _run(study, "D/sweep/grpo/grpo-lr1e-05-seed100", "complete", 1800.0, 1800.0)
    left = study_ledger.remaining(study_ledger.ledger(study), json.loads((study / "protocol.json").read_text()))
    # A: the sweep is done; 5 main runs left at the one finished main run's 3,600 s. B: nothing finished,
    # nothing to project from. D: no main run yet, so the sweep's mean stands for both blocks.
    assert left == [{"setting": "A", "sweep_left": 0, "main_left": 5, "projected_core_hours": 5.0},
                    {"setting": "B", "sweep_left": 2, "main_left": 3, "projected_core_hours": None},
                    {"setting": "D", "sweep_left": 1, "main_left": 3, "projected_core_hours": 2.0}]
    assert study_ledger.main([str(study)]) == 0
    out = capsys.readouterr().out
    assert "| A | 0 | 5 | 5.0 |" in out and "| B | 2 | 3 |  |" in out and "| C |" not in out.split("What is left")[1]
