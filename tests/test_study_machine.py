"""scripts/study_machine.py adds a new machine to a study's machines.csv once, in the ledger's format."""

import datetime
from pathlib import Path

import pytest
from repo_scripts import load_script

study_machine = load_script("scripts/study_machine.py")
study_ledger = load_script("scripts/study_ledger.py")

UTC = datetime.timezone.utc
HEADER = ",".join(study_machine.COLUMNS) + "\n"


def _machine(booted: str) -> dict:
    return {"booted": datetime.datetime.fromisoformat(booted).replace(tzinfo=UTC),
            "now": datetime.datetime(2026, 12, 7, 11, 29, tzinfo=UTC), "cpu": "AMD EPYC", "cores": 2,
            "capability": "AVX512"}


def test_a_new_machine_gets_the_days_next_letter_and_the_same_boot_is_not_added_twice(tmp_path):
    path = tmp_path / "machines.csv"
    path.write_text(HEADER + "before,,not recorded,2,not recorded,x\n"
                             "2026-12-07a,2026-12-07T00:49,AMD EPYC,2,AVX2,y\n")
    assert study_machine.note_machine(path, _machine("2026-12-07T11:27:30")) == ("2026-12-07b", True)
    assert study_machine.note_machine(path, _machine("2026-12-07T11:28:40")) == ("2026-12-07b", False)
    assert path.read_text().splitlines()[-1] == "2026-12-07b,2026-12-07T11:27,AMD EPYC,2,AVX512,2026-12-07 11:29"
    assert len(path.read_text().splitlines()) == 4
    assert [m["machine"] for m in study_ledger.machines(tmp_path)] == ["before", "2026-12-07a", "2026-12-07b"]


def test_the_first_machine_of_an_empty_table(tmp_path):
    path = tmp_path / "machines.csv"
    path.write_text(HEADER)
    assert study_machine.note_machine(path, _machine("2026-12-08T09:00:00")) == ("2026-12-08a", True)


def test_the_columns_are_the_ledgers_and_another_header_is_refused(tmp_path):
    assert study_machine.COLUMNS == study_ledger.MACHINE_COLUMNS
    path = tmp_path / "machines.csv"
    path.write_text("machine,booted\n")
    with pytest.raises(ValueError, match="its header must be machine,booted_utc"):
        study_machine.note_machine(path, _machine("2026-12-08T09:00:00"))


def test_the_command_names_this_machine_and_a_missing_file_in_one_line(tmp_path, capsys):
    path = tmp_path / "machines.csv"
    path.write_text(HEADER)
    assert study_machine.main([str(path)]) == 0
    assert study_machine.main([str(path)]) == 0  # this machine again: found, not added
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("machine: new, ") and out[1].startswith("machine: ") and "new" not in out[1]
    assert len(path.read_text().splitlines()) == 2
    assert study_machine.main([str(tmp_path / "nope.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_committed_table_is_in_the_format():
    path = Path(__file__).resolve().parents[1] / "results" / "where-credit-pays" / "machines.csv"
    assert path.read_text().splitlines()[0] == HEADER.strip()
