"""scripts/lr_sweep.py: the picking rule by hand on synthetic scores, the refusals that keep a sweep
fair (tuning seeds overlapping evaluation seeds, overrides of the sweep's own axes), and a tiny real
sweep on the embedded model (2 rates x 1 seed x 2 methods) that writes its choice and evidence and
resumes only what is missing when rerun."""

import json
import os
import sys

import pytest
import yaml
from repo_scripts import load_script


@pytest.fixture(scope="module")
def sweep():
    return load_script("scripts/lr_sweep.py")


# --------------------------------------------------------------------------- the rule, by hand


def test_a_run_scores_the_mean_of_its_last_evals_after_training(sweep):
    curve = {0: 0.9, 2: 0.1, 4: 0.3, 6: 0.5}  # step 0 is before training: never counted
    assert sweep.run_score(curve, 2) == pytest.approx(0.4)
    assert sweep.run_score(curve, 1) == pytest.approx(0.5)
    assert sweep.run_score(curve, 10) == pytest.approx(0.3)  # fewer evals than asked: all of them
    with pytest.raises(sweep.SweepError, match="no held-out eval after training"):
        sweep.run_score({0: 0.5}, 3)


def test_the_highest_mean_over_seeds_wins_and_a_tie_goes_to_the_smaller_rate(sweep):
    choice = sweep.pick({
        "a": {1e-5: [0.5, 0.7], 3e-5: [0.6, 0.6], 1e-4: [0.2, 0.3]},  # 0.6, 0.6, 0.25: tie -> 1e-5
        "b": {1e-5: [0.1, 0.2], 3e-5: [0.4, 0.1], 1e-4: [0.3, 0.3]},  # 0.15, 0.25, 0.30 -> 1e-4
        "c": {3e-5: [0.2 + 1e-12], 1e-5: [0.2]},                       # equal within 1e-9 -> 1e-5
    })
    assert {m: c["lr"] for m, c in choice.items()} == {"a": 1e-5, "b": 1e-4, "c": 1e-5}
    assert choice["b"]["score"] == pytest.approx(0.30) and choice["a"]["by_lr"][1e-4] == pytest.approx(0.25)
    # the rule does not look at single seeds: a's best seed (0.7 at 1e-5) does not decide


# --------------------------------------------------------------------------- refusals


def test_tuning_seeds_that_are_evaluation_seeds_are_refused(sweep, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        sweep.main(["--methods", "grpo", "--lrs", "1e-5", "--tuning-seeds", "0", "7", "--eval-seeds", "0", "1",
                    "--out", str(tmp_path)])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: tuning seeds [0] are also evaluation seeds (--eval-seeds); pick tuning seeds disjoint from them, "
        "e.g. 100 101 102")
    assert not any(tmp_path.iterdir())  # nothing ran


def test_an_override_of_the_sweeps_own_axes_is_refused(sweep, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        sweep.main(["--methods", "grpo", "--lrs", "1e-5", "--tuning-seeds", "100", "--eval-seeds", "0",
                    "--out", str(tmp_path), "--", "train.steps=2", "train.lr=1e-3"])
    assert info.value.code == 2
    assert "override 'train.lr=1e-3' sets one of the sweep's own axes" in capsys.readouterr().err


# --------------------------------------------------------------------------- a real sweep

TINY = ["benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=2", "sampling.max_new_tokens=24",
        "train.steps=2", "train.prompts_per_step=2", "train.minibatch_size=4", "train.updates_per_batch=1",
        "train.eval_every=1", "train.eval_problems=2", "train.eval_samples=2", "train.save_every=0",
        "train.save_rollouts=0"]


def test_a_tiny_sweep_picks_each_methods_rate_from_its_runs_and_resumes(sweep, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "sweep"
    argv = ["--methods", "grpo", "rloo", "--lrs", "1e-3", "1e-6", "--tuning-seeds", "100", "--eval-seeds", "0", "1",
            "--last-evals", "2", "--out", str(out), "--jobs", "2", "--python", sys.executable, "--", *TINY]
    assert sweep.main(argv).keys() == {"grpo", "rloo"}
    evidence = json.loads((out / "lr_sweep.json").read_text())
    assert evidence["lrs"] == [1e-6, 1e-3] and evidence["tuning_seeds"] == [100] and evidence["eval_seeds"] == [0, 1]
    assert evidence["rule"].startswith("score of a run = mean of its last 2 held-out pass@1 evals")
    runs = {(r["method"], r["lr"]): r for r in evidence["runs"]}
    assert set(runs) == {(m, lr) for m in ("grpo", "rloo") for lr in (1e-6, 1e-3)}
    for (method, lr), run in runs.items():
        config = yaml.safe_load((out / f"{method}-lr{lr:g}-seed100" / "train" / "config.yaml").read_text())
        assert (config["method"]["name"], config["train"]["lr"], config["seed"]) == (method, lr, 100)
        assert config["train"]["data_order_seed"] == 100  # the tuning seed also orders the data
        assert sorted(map(int, run["evals"])) == [0, 1, 2]  # before training, then every step
        assert run["score"] == pytest.approx((run["evals"]["1"] + run["evals"]["2"]) / 2)
        assert run["budget"] == runs[("grpo", 1e-6)]["budget"]  # one budget for every cell
    for method in ("grpo", "rloo"):  # the choice is the rule applied to the recorded scores
        expected = sweep.pick({method: {lr: [runs[(method, lr)]["score"]] for lr in (1e-6, 1e-3)}})[method]
        assert evidence["choice"][method]["lr"] == expected["lr"]
    md = (out / "lr_sweep.md").read_text()
    assert "| method | lr 1e-06 | lr 0.001 | chosen |" in md and "Tuning seeds 100 (evaluation seeds 0, 1" in md

    # An interrupted sweep: one cell's run dir is gone. The rerun trains that cell alone; the finished
    # ones are left as they are (rredcot train: "up to date"), and the choice is the same.
    lost = out / "rloo-lr0.001-seed100"
    for path in sorted(lost.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    lost.rmdir()
    capsys.readouterr()
    assert sweep.main(argv) == {m: c["lr"] for m, c in evidence["choice"].items()}
    logs = {p.stem: p.read_text() for p in (out / "logs").glob("*.log")}
    assert "up to date" in logs["grpo-lr1e-06-seed100"] and "up to date" not in logs["rloo-lr0.001-seed100"]
    assert json.loads((out / "lr_sweep.json").read_text())["runs"] == evidence["runs"]
    assert os.path.isfile(lost / "train" / "summary.json")


def test_a_rerun_appends_to_each_cells_log_so_its_first_attempt_stays(sweep, tmp_path):
    # A sweep rerun after an interruption runs every cell again: a finished cell prints "up to date",
    # a resumed one its remaining steps. Opening the log for writing erased the first attempt's lines.
    cells = {"grpo-lr1e-05-seed100": [sys.executable, "-c", "print('attempt')"]}
    assert sweep.run_cells(cells, 1, tmp_path / "logs") == []
    assert sweep.run_cells(cells, 1, tmp_path / "logs") == []
    assert (tmp_path / "logs" / "grpo-lr1e-05-seed100.log").read_text() == "attempt\nattempt\n"
