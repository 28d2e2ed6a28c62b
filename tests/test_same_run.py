"""scripts/same_run.py, the refactor check: two run folders with the same numbers pass, and one
changed metric, eval row or weight is named (wall-clock columns are not compared)."""

import json
import math
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from repo_scripts import load_script

same_run = load_script("scripts/same_run.py")


def _run(folder, loss=0.5, seconds=1.0, answer="4", weight=1.0):
    train = folder / "train"
    (train / "metrics.parquet").mkdir(parents=True)
    (train / "checkpoints" / "final").mkdir(parents=True)
    pq.write_table(pa.table({"step": [1], "loss": [loss], "entropy": [math.nan], "seconds": [seconds]}),
                   train / "metrics.parquet" / "part-000000.parquet")
    pq.write_table(pa.table({"prompt_id": [0], "completion": [answer]}), train / "eval.parquet")
    (train / "summary.json").write_text(json.dumps({"steps": 1, "eval_after": {"pass@1": 0.5}, "seconds": seconds}))
    save_file({"w": torch.full((2,), weight)}, train / "checkpoints" / "final" / "model.safetensors")
    return folder


def test_the_same_numbers_pass_whatever_the_wall_clock(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", seconds=9.0)
    assert same_run.main([str(a), str(b)]) == 0
    assert "identical" in capsys.readouterr().out


def test_a_changed_metric_eval_row_or_weight_is_named(tmp_path, capsys):
    a = _run(tmp_path / "a")
    for name, changed in {"loss": {"loss": 0.5000001}, "completion": {"answer": "5"}, "weight w": {"weight": 1.5}}.items():
        b = _run(tmp_path / name, **changed)
        assert same_run.main([str(a), str(b)]) == 1
        assert name in capsys.readouterr().out
        shutil.rmtree(b)


def test_a_run_kept_without_checkpoints_is_compared_without_its_weights(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", weight=1.5)
    shutil.rmtree(a / "train" / "checkpoints")  # as committed study runs are kept
    assert same_run.main([str(a), str(b)]) == 2
    assert "pass --no-weights" in capsys.readouterr().err
    assert same_run.main(["--no-weights", str(a), str(b)]) == 0  # the weights differ, but are not compared
    assert "identical" in capsys.readouterr().out
    c = _run(tmp_path / "c", loss=0.25)
    assert same_run.main(["--no-weights", str(a), str(c)]) == 1
    assert "loss" in capsys.readouterr().out


def test_a_folder_that_is_no_finished_run_is_one_line(tmp_path, capsys):
    a = _run(tmp_path / "a")
    assert same_run.main([str(a), str(tmp_path / "typo")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'typo'} is not a finished run folder (no train/summary.json)\n"
