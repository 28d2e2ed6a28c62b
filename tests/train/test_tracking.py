"""Trackers (rredcot_cli/train/tracking.py): each adapter, with its own library, writes the step scalars
where a user reads them back offline, and a resumed run (same run id) continues the same tracker
run. TensorBoard is in the test extra; the others are skipped unless installed
(pip install "rredcot[wandb,trackio,mlflow]"). `rredcot train tracking=[tensorboard]` end to end is
in tests/train/test_live_train.py."""

import json
import sqlite3
import subprocess
import sys

import pytest

from rredcot_cli.train import tracking

CONFIG = {"seed": 3, "train": {"lr": 3e-5, "betas": [0.9, 0.99]}, "tracking": ["x"]}
ROWS = [{"step": s, "reward_mean": 0.25 * s, "accuracy": 0.5, "kl": float("nan"), "eval_accuracy": None,
         "sampling_rounds": None} for s in (1, 2, 3)]


def log_run(name, folder, steps=ROWS, run_id="0123456789ab"):
    trackers = tracking.open_trackers([name], folder, config=CONFIG, run_id=run_id, run_name="demo")
    for row in steps:
        trackers.log(row, row["step"])
    trackers.close()


def test_only_finite_numbers_reach_the_trackers():
    seen = []

    class Recorder:
        def log(self, scalars, step):
            seen.append((step, scalars))

        def close(self):
            pass

    trackers = tracking.Trackers([Recorder()])
    trackers.log({"step": 4, "loss": 1.5, "kl": float("nan"), "eval_accuracy": None, "tokens": 7, "ok": True}, 4)
    assert seen == [(4, {"loss": 1.5, "tokens": 7.0})]


def test_unknown_or_missing_tracker_is_one_line(monkeypatch):
    with pytest.raises(tracking.TrackingError, match=r"unknown tracker 'neptune'; valid: tensorboard, wandb, trackio, mlflow"):
        tracking.check(["neptune"])
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tracking.TrackingError) as e:
        tracking.check(["wandb"])
    assert str(e.value) == 'tracking: wandb is not installed; pip install "rredcot[wandb]"'
    assert tracking.check([]) == []


def test_cli_refuses_an_unknown_tracker_before_loading_anything(tmp_path):
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", "train", f"run.dir={tmp_path / 'r'}",
                             "tracking=[tensorbored]"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: tracking=[tensorbored]: unknown tracker 'tensorbored'; valid: tensorboard, wandb, trackio, mlflow"]
    assert not (tmp_path / "r").exists()


def test_tensorboard_events_hold_scalars_config_and_run_id(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_run("tensorboard", tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/reward_mean")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert "train/kl" not in events.Tags()["scalars"]  # NaN: not sent
    assert {"config/text_summary", "run_id/text_summary"} <= set(events.Tags()["tensors"])


def test_wandb_offline_run_is_written_under_the_train_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_run("wandb", tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*-0123456789ab"))
    assert len(runs) == 1 and (runs[0] / "run-0123456789ab.wandb").stat().st_size > 0


def test_trackio_local_store_holds_the_scalars_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    pytest.importorskip("trackio")
    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]);"
        "from tests.test_tracking import log_run, ROWS;"
        "log_run('trackio', Path(sys.argv[1]), steps=ROWS[:2]); log_run('trackio', Path(sys.argv[1]), steps=ROWS[2:])"
    )  # a fresh interpreter: trackio reads TRACKIO_DIR when it is imported
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    subprocess.run([sys.executable, "-c", script, str(tmp_path), root], check=True, capture_output=True, cwd=tmp_path)
    db = sqlite3.connect(tmp_path / "trackio" / "rredcot.db")
    rows = db.execute("select run_name, step, metrics from metrics order by step").fetchall()
    assert [(name, step, json.loads(m)["train/reward_mean"]) for name, step, m in rows] == [
        ("demo-0123456789ab", 1, 0.25), ("demo-0123456789ab", 2, 0.5), ("demo-0123456789ab", 3, 0.75)]


def test_mlflow_local_database_holds_params_and_scalars_and_a_resume_continues_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_run("mlflow", tmp_path, steps=ROWS[:2])
    log_run("mlflow", tmp_path, steps=ROWS[2:])  # the same run id: the same mlflow run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rredcot").experiment_id])
    assert run.data.tags["rredcot_run_id"] == "0123456789ab"
    assert run.data.params["train.lr"] == "3e-05" and run.data.params["train.betas"] == "[0.9, 0.99]"
    history = client.get_metric_history(run.info.run_id, "train/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5), (3, 0.75)]
