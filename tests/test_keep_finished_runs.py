"""scripts/keep_finished_runs.py copies a study's finished runs, and nothing unfinished, into the tree to commit."""

import json
from pathlib import Path

from repo_scripts import load_script

keep = load_script("scripts/keep_finished_runs.py")


def _run(root: Path, rel: str, status: str) -> Path:
    train = root / rel / "train"
    (train / "checkpoints" / "step-10").mkdir(parents=True)
    (train / "checkpoints" / "step-10" / "model.safetensors").write_bytes(b"weights")
    (train / "manifest.json").write_text(json.dumps({"status": status}))
    (train / "metrics.parquet").write_bytes(b"metrics of " + rel.encode())
    (train / ".rredcot.lock").write_text("")
    (train / "rollouts" / "step-10" / "sample").mkdir(parents=True)
    (train / "rollouts" / "step-10" / "sample" / "samples.parquet").write_bytes(b"rows")
    return root / rel


def _study(root: Path) -> Path:
    setting = root / "A"
    _run(setting, "sweep/grpo/grpo-lr1e-05-seed100", "complete")
    _run(setting, "sweep/grpo/grpo-lr3e-05-seed100", "running")
    (setting / "sweep/grpo/logs").mkdir(parents=True)
    (setting / "sweep/grpo/logs/grpo-lr1e-05-seed100.log").write_text("done\n")
    (setting / "sweep/grpo/logs/grpo-lr3e-05-seed100.log").write_text("step 3\n")
    (setting / "sweep/grpo/lr_sweep.json").write_text("{}")
    _run(setting, "runs/rredcot-lr3e-05-seed0", "complete")
    _run(setting, "runs/grpo-lr3e-05-seed1", "failed")
    (setting / "failed_runs.txt").write_text("runs/grpo-lr3e-05-seed1 failed\n")
    return setting


def test_keeps_finished_runs_their_logs_and_the_records_but_not_checkpoints_locks_or_unfinished_runs(tmp_path):
    src = _study(tmp_path / "src")
    kept = {str(p) for p in keep.files_to_keep(src)}
    assert kept == {
        "failed_runs.txt",
        "runs/rredcot-lr3e-05-seed0/train/manifest.json",
        "runs/rredcot-lr3e-05-seed0/train/metrics.parquet",
        "runs/rredcot-lr3e-05-seed0/train/rollouts/step-10/sample/samples.parquet",
        "sweep/grpo/grpo-lr1e-05-seed100/train/manifest.json",
        "sweep/grpo/grpo-lr1e-05-seed100/train/metrics.parquet",
        "sweep/grpo/grpo-lr1e-05-seed100/train/rollouts/step-10/sample/samples.parquet",
        "sweep/grpo/logs/grpo-lr1e-05-seed100.log",
        "sweep/grpo/lr_sweep.json",
    }


def test_copies_once_then_skips_equal_files_and_refuses_to_overwrite_a_run_file(tmp_path, capsys):
    src, dst = _study(tmp_path / "src"), tmp_path / "dst" / "A"
    assert keep.main([str(src), str(dst)]) == 0
    assert (dst / "runs/rredcot-lr3e-05-seed0/train/metrics.parquet").read_bytes() == b"metrics of runs/rredcot-lr3e-05-seed0"
    assert not (dst / "runs/grpo-lr3e-05-seed1").exists()
    assert not (dst / "runs/rredcot-lr3e-05-seed0/train/checkpoints").exists()
    assert "2 finished runs of 4, 9 files copied, 0 records replaced, 0 conflicting" in capsys.readouterr().out

    assert keep.main([str(src), str(dst)]) == 0  # a second pass copies nothing
    assert "0 files copied" in capsys.readouterr().out

    metrics = dst / "runs/rredcot-lr3e-05-seed0/train/metrics.parquet"
    metrics.write_bytes(b"other metrics")
    assert keep.main([str(src), str(dst)]) == 1
    assert metrics.read_bytes() == b"other metrics"
    assert "runs/rredcot-lr3e-05-seed0/train/metrics.parquet differs" in capsys.readouterr().err


def test_a_record_outside_the_runs_that_grew_is_replaced_and_listed(tmp_path, capsys):
    src, dst = _study(tmp_path / "src"), tmp_path / "dst"
    keep.main([str(src), str(dst)])
    (src / "failed_runs.txt").write_text("runs/grpo-lr3e-05-seed1 failed\nruns/grpo-lr3e-05-seed1 failed\n")
    assert keep.main([str(src), str(dst)]) == 0
    assert (dst / "failed_runs.txt").read_text().count("failed") == 2
    assert "1 records replaced" in capsys.readouterr().out


def test_a_run_that_finishes_later_is_copied_on_the_next_pass(tmp_path):
    src, dst = _study(tmp_path / "src"), tmp_path / "dst"
    keep.copy_kept(src, dst)
    manifest = src / "sweep/grpo/grpo-lr3e-05-seed100/train/manifest.json"
    manifest.write_text(json.dumps({"status": "complete"}))
    copied, replaced, conflicts, kept_logs = keep.copy_kept(src, dst)
    assert replaced == conflicts == kept_logs == []
    assert {str(p) for p in copied} == {
        "sweep/grpo/grpo-lr3e-05-seed100/train/manifest.json",
        "sweep/grpo/grpo-lr3e-05-seed100/train/metrics.parquet",
        "sweep/grpo/grpo-lr3e-05-seed100/train/rollouts/step-10/sample/samples.parquet",
        "sweep/grpo/logs/grpo-lr3e-05-seed100.log",
    }


def test_a_missing_source_is_one_clear_line(tmp_path, capsys):
    assert keep.main([str(tmp_path / "nope"), str(tmp_path / "dst")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_a_sweep_log_that_grew_is_replaced_and_one_a_rerun_rewrote_is_kept(tmp_path, capsys):
    # A sweep rerun at the study's pinned commit rewrote a finished run's log to one "up to date" line;
    # the copy kept at the first pass is the whole history, so it stays. A log that only grew replaces it.
    src, dst = _study(tmp_path / "src"), tmp_path / "dst"
    keep.main([str(src), str(dst)])
    src_log, dst_log = (root / "sweep/grpo/logs/grpo-lr1e-05-seed100.log" for root in (src, dst))
    src_log.write_text("up to date; skipping\n")
    capsys.readouterr()
    assert keep.main([str(src), str(dst)]) == 0
    assert dst_log.read_text() == "done\n"
    assert "kept " in capsys.readouterr().out

    src_log.write_text("done\nup to date; skipping\n")
    assert keep.main([str(src), str(dst)]) == 0
    assert dst_log.read_text() == "done\nup to date; skipping\n"
    assert "1 records replaced" in capsys.readouterr().out
