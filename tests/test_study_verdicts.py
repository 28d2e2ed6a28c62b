"""scripts/study_verdicts.py: section 3 of the study page from the driver's verdict files, checked
against the committed runs; and the page carries, verbatim, what the script prints for every
setting whose verdicts are committed."""

import contextlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from repo_scripts import REPO, load_script

COMMIT = "fd4b0cfa74f6cfa0f17f1c46831fbbbbd9559188"
STUDY = REPO / "results" / "where-credit-pays"
PAGE = REPO / "docs" / "studies" / "where-credit-pays.md"


@pytest.fixture(scope="module")
def verdicts():
    return load_script("scripts/study_verdicts.py")


@pytest.fixture(scope="module")
def paired():
    return load_script("bench/paired_seeds.py")


def _run(runs: Path, arm: str, lr: str, seed: int, curve: dict, before: float, seconds: float) -> None:
    """One finished run: evals ``curve = {step: pass@1}`` (the last step's is ``eval_after``)."""
    train = runs / f"{arm}-lr{lr}-seed{seed}" / "train"
    train.mkdir(parents=True)
    last = max(curve)
    (train / "summary.json").write_text(json.dumps({
        "steps": last, "seconds": seconds, "eval_before": {"pass@1": before}, "eval_after": {"pass@1": curve[last]}}))
    (train / "manifest.json").write_text(json.dumps({"stage": "train", "status": "complete",
                                                     "git": {"sha": COMMIT, "dirty": False}}))
    steps = list(range(1, last + 1))
    pq.write_table(pa.table({"step": steps, "eval_accuracy": [curve.get(s) for s in steps]}), train / "metrics.parquet")


def _study(tmp_path: Path, paired) -> Path:
    """A study with setting S: grpo and rredcot over three seeds, and the driver's two verdict files."""
    study = tmp_path / "study"
    runs = study / "S" / "runs"
    grpo = {0: {5: 0.30, 10: 0.40}, 1: {5: 0.20, 10: 0.30}, 2: {5: 0.25, 10: 0.35}}
    rredcot = {0: {5: 0.40, 10: 0.50}, 1: {5: 0.30, 10: 0.40}, 2: {5: 0.45, 10: 0.55}}
    for seed in grpo:
        _run(runs, "grpo", "1e-05", seed, grpo[seed], before=0.1, seconds=600)
        _run(runs, "rredcot", "3e-05", seed, rredcot[seed], before=0.1, seconds=900)
    for endpoint, name in (("mean-eval", "verdict_mean_eval.json"), ("final", "verdict_final.json")):
        with contextlib.redirect_stdout(io.StringIO()):  # as the driver: its JSON line goes to the log
            paired.main([str(runs), "--methods", "rredcot", "--baseline", "grpo", "--endpoint", endpoint,
                         "--margin", "0.03", "--out", str(study / "S" / name)])
    (study / "protocol.json").write_text(json.dumps({
        "statistics": {"primary_comparison": "rredcot", "baseline": "grpo"}, "settings": {"S": {}, "T": {}}}))
    return study


def test_the_markdown_by_hand(verdicts, paired, tmp_path, capsys):
    study = _study(tmp_path, paired)
    assert verdicts.main([str(study), "S", "--check"]) == 0
    text = capsys.readouterr().out
    # differences 0.1, 0.1, 0.2 (both endpoints): mean 0.1333, sd 0.0577, 95 % t (df 2, 4.3027):
    # +-0.1434; sign flips of three positive pairs: 2 of 8 reach the sum, p = 0.25 -> unresolved
    assert text.startswith("### Setting S\n\n**Verdict (rredcot - grpo, mean held-out pass@1 over the eval steps): "
                           "unresolved.** 3 pairs, mean difference +0.133, 95 % interval [-0.010, +0.277], "
                           "exact sign-flip p = 0.2500")
    assert "| rredcot - grpo | mean-eval | primary | 3 | +0.133 [-0.010, +0.277] | 0.058 | 0.2500 |" in text
    assert "| rredcot - grpo | final | exploratory | 3 | +0.133 [-0.010, +0.277] | 0.058 | 0.2500 | 0.9549 | 0.179 | none (exploratory) |" in text
    # per arm: grpo's mean-eval 0.35, 0.25, 0.30 -> 0.300 +-4.3027 x 0.05 / sqrt 3 = 0.124, 10 minutes a run;
    # rredcot's 0.45, 0.35, 0.50 -> 0.433 +-4.3027 x 0.0764 / sqrt 3 = 0.190
    assert "| grpo | 1e-05 | 3 | 0.100 | 0.300 [0.176, 0.424] | 0.350 [0.226, 0.474] | 10.0 |" in text
    assert "| rredcot | 3e-05 | 3 | 0.100 | 0.433 [0.244, 0.623] | 0.483 [0.294, 0.673] | 15.0 |" in text
    assert "failed" not in text


def test_failed_runs_are_listed(verdicts, paired, tmp_path, capsys):
    study = _study(tmp_path, paired)
    (study / "S" / "failed_runs.txt").write_text("results/S/runs/grpo-lr1e-05-seed3 failed (exit 1, 2026-12-07T15:00:00Z)\n")
    assert verdicts.main([str(study), "S"]) == 0
    assert "- results/S/runs/grpo-lr1e-05-seed3 failed (exit 1, 2026-12-07T15:00:00Z)" in capsys.readouterr().out


def test_a_verdict_file_that_does_not_recompute_is_refused(verdicts, paired, tmp_path, capsys):
    study = _study(tmp_path, paired)
    path = study / "S" / "verdict_final.json"
    report = json.loads(path.read_text())
    report["methods"]["rredcot"]["pooled"]["verdict"] = "helps"
    path.write_text(json.dumps(report))
    assert verdicts.main([str(study), "S"]) == 0  # without --check it is shown as committed
    capsys.readouterr()
    assert verdicts.main([str(study), "S", "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: rredcot verdict is 'helps' but the committed runs give 'unresolved'")
    assert err.count("\n") == 1


def test_a_changed_run_is_found_by_the_check(verdicts, paired, tmp_path, capsys):
    study = _study(tmp_path, paired)
    summary = study / "S" / "runs" / "rredcot-lr3e-05-seed2" / "train" / "summary.json"
    data = json.loads(summary.read_text())
    data["eval_after"]["pass@1"] = 0.35
    summary.write_text(json.dumps(data))
    assert verdicts.main([str(study), "S", "--check"]) == 1
    assert "but the committed runs give" in capsys.readouterr().err


def test_no_verdicts_yet_is_one_line_and_no_look(verdicts, paired, tmp_path, capsys):
    study = _study(tmp_path, paired)
    (study / "T").mkdir()
    assert verdicts.main([str(study), "T"]) == 1
    err = capsys.readouterr().err
    assert "no verdict_mean_eval.json or verdict_final.json yet" in err and "no interim looks" in err
    assert verdicts.main([str(study), "U"]) == 1
    assert "registers no setting 'U'; pick from S, T" in capsys.readouterr().err


def test_the_page_shows_each_committed_settings_verdicts_verbatim(verdicts, capsys, monkeypatch):
    """Once a setting's driver has written its verdict files, section 3 of the page must hold what the
    script prints for it (checked against the committed runs). Settings still running are skipped."""
    settings = json.loads((STUDY / "protocol.json").read_text())["settings"]
    done = [s for s in settings if (STUDY / s / "verdict_mean_eval.json").is_file()]
    monkeypatch.chdir(REPO)  # the page names the runs folder as results/where-credit-pays/<setting>/runs
    section = PAGE.read_text().split("## 3. Verdicts", 1)[1].split("\n## 4.", 1)[0]
    for setting in done:
        assert verdicts.main([str(STUDY.relative_to(REPO)), setting, "--check"]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out in section, f"section 3 does not show scripts/study_verdicts.py's {setting}"
