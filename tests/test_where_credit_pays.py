"""The pre-registration (docs/studies/where-credit-pays.md) and its driver (scripts/where_credit_pays.sh)
cannot drift apart: the document embeds results/where-credit-pays/protocol.json verbatim, and the
script's dry run lists exactly the registered arms, seeds, budget, rate grid and statistics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "studies" / "where-credit-pays.md"
PROTOCOL = ROOT / "results" / "where-credit-pays" / "protocol.json"
SCRIPT = ROOT / "scripts" / "where_credit_pays.sh"


# An empty results folder of its own, so that sweeps finished in a developer's runs/ cannot change
# what the dry run prints.
RESULTS = "runs/where-credit-pays-dry-run-test"


def dry_run(*args: str, protocol: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "RESULTS": RESULTS}
    env.pop("PROTOCOL", None)
    if protocol is not None:
        env["PROTOCOL"] = str(protocol)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def protocol() -> dict:
    return json.loads(PROTOCOL.read_text())


def test_the_document_embeds_the_protocol_verbatim():
    blocks = re.findall(r"<!-- protocol.json -->\n```json\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/studies/where-credit-pays.md must hold one ```json block after <!-- protocol.json -->"
    assert blocks[0] == PROTOCOL.read_text()


def _commands(output: str, head: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.split()[1:3] == head.split()]


REGISTERED = [name for name, s in json.loads(PROTOCOL.read_text())["settings"].items() if s["status"] == "registered"]


@pytest.mark.parametrize("name", REGISTERED)
def test_the_dry_run_lists_the_registered_study(protocol, name):
    setting = protocol["settings"][name]
    result = dry_run(name)
    assert result.returncode == 0, result.stderr
    budget, arms, seeds = setting["budget"], setting["arms"], setting["eval_seeds"]
    assert len(arms) == 2 and len(set(seeds)) == len(seeds) >= 2
    assert not set(seeds) & set(setting["lr_sweep"]["tuning_seeds"])

    sweeps = _commands(result.stdout, "scripts/lr_sweep.py --methods")
    assert [s[3] for s in sweeps] == [arms[a][0].removeprefix("method=") for a in arms]
    grid = " ".join(format(lr, "g") for lr in setting["lr_sweep"]["lrs"])
    tuning = " ".join(map(str, setting["lr_sweep"]["tuning_seeds"]))
    for sweep, arm in zip(sweeps, arms):
        line = " ".join(sweep)
        assert f"--lrs {grid} --tuning-seeds {tuning} --eval-seeds {' '.join(map(str, seeds))}" in line
        assert f"--last-evals {setting['lr_sweep']['last_evals']}" in line
        assert sweep[sweep.index("--") + 1:] == budget + arms[arm][1:]       # the same budget for every arm

    trains = _commands(result.stdout, "-m rredcot_cli")
    assert len(trains) == len(arms) * len(seeds)
    expected = {(arm, seed) for arm in arms for seed in seeds}
    for train in trains:
        assert train[4:4 + len(budget)] == budget
        arm = next(a for a in arms if f"run.dir={RESULTS}/{name}/runs/{a}-lrLR_FROM_SWEEP-seed" in " ".join(train))
        seed = int(next(t for t in train if t.startswith("seed=")).split("=")[1])
        assert train[4 + len(budget):4 + len(budget) + len(arms[arm])] == arms[arm]
        assert f"train.data_order_seed={seed}" in train and "train.resume=true" in train
        expected.discard((arm, seed))
    assert not expected, f"arm/seed pairs without a run: {sorted(expected)}"

    verdicts = _commands(result.stdout, f"bench/paired_seeds.py {RESULTS}/{name}/runs")
    stats = protocol["statistics"]
    assert [v[v.index("--endpoint") + 1] for v in verdicts] == [protocol["endpoint"]["primary"], protocol["endpoint"]["secondary"]]
    for verdict in verdicts:
        assert verdict[verdict.index("--margin") + 1] == format(stats["margin"], "g")
        assert verdict[verdict.index("--baseline") + 1] == stats["baseline"]
        assert stats["primary_comparison"] in verdict


@pytest.mark.parametrize("name", REGISTERED)
def test_the_further_arms_dry_run(protocol, name):
    result = dry_run(name, "further")
    assert result.returncode == 0, result.stderr
    further = protocol["settings"][name]["further_arms"]
    if not further:
        assert result.stdout == (f"setting {name} registers no further arms in results/where-credit-pays/protocol.json; "
                                 "nothing to run\n")
        return
    assert f"further arms: {' '.join(further)};" in result.stdout
    trains = _commands(result.stdout, "-m rredcot_cli")
    assert len(trains) == len(further) * len(protocol["settings"][name]["eval_seeds"])


def test_settings_registered_as_future_work_are_refused_in_one_line(protocol, tmp_path):
    """On a copy of the protocol with one setting put back to future work, so that the test keeps
    its subject once every real setting is registered."""
    future = json.loads(json.dumps(protocol))
    future["settings"]["later"] = {"status": "future work", "what": "a sketch without budget or arms"}
    (tmp_path / "protocol.json").write_text(json.dumps(future))
    result = dry_run("later", protocol=tmp_path / "protocol.json")
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: setting later is registered as 'future work' in {tmp_path / 'protocol.json'} "
                                     "(docs/studies/where-credit-pays.md says what it needs); run a registered one: "
                                     + ", ".join(n for n, s in protocol["settings"].items() if s["status"] == "registered"))


def _finished_run(train: Path, curve: dict) -> None:
    train.mkdir(parents=True)
    last = max(curve)
    (train / "summary.json").write_text(json.dumps({"steps": last, "seconds": 10.0, "eval_after": {"pass@1": curve[last]}}))
    (train / "manifest.json").write_text(json.dumps({"stage": "train", "status": "complete",
                                                     "git": {"sha": "fd4b0cfa74f6cfa0f17f1c46831fbbbbd9559188"}}))
    steps = list(range(1, last + 1))
    pq.write_table(pa.table({"step": steps, "eval_accuracy": [curve.get(s) for s in steps]}), train / "metrics.parquet")


def test_a_failed_run_is_listed_and_no_verdict_is_computed_until_every_run_finished(protocol, tmp_path):
    """Seeds 0-2, sweeps done, five of six main runs finished; the sixth crashes (a PYTHON whose
    `-m rredcot_cli train` fails): it is listed, and the verdicts wait until FINAL=1."""
    small = json.loads(json.dumps(protocol))
    small["settings"]["A"]["eval_seeds"] = [0, 1, 2]
    (tmp_path / "protocol.json").write_text(json.dumps(small))
    out = tmp_path / "results" / "A"
    for arm, lr in (("grpo", "3e-05"), ("rredcot", "1e-05")):
        (out / "sweep" / arm).mkdir(parents=True)
        (out / "sweep" / arm / "lr_sweep.json").write_text(json.dumps({"choice": {arm: {"lr": float(lr)}}}))
    for seed, (g, r) in enumerate(((0.3, 0.4), (0.2, 0.2), (0.5, None))):
        _finished_run(out / "runs" / f"grpo-lr3e-05-seed{seed}" / "train", {5: g, 10: g})
        if r is not None:
            _finished_run(out / "runs" / f"rredcot-lr1e-05-seed{seed}" / "train", {5: r, 10: r})
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\nif [[ "$1 $2" == "-m rredcot_cli" ]]; then echo crashed >&2; exit 3; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "RESULTS": str(tmp_path / "results"),
           "PROTOCOL": str(tmp_path / "protocol.json")}
    env.pop("DRY_RUN", None)
    result = subprocess.run(["bash", str(SCRIPT), "A"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"skip {out}/runs/rredcot-lr1e-05-seed1 (complete)" in result.stdout
    assert (out / "failed_runs.txt").read_text().startswith(f"{out}/runs/rredcot-lr1e-05-seed2 failed (exit 3, ")
    assert ("1 of 6 registered runs are not finished: no verdict yet (no interim looks); rerun this command, or set "
            "FINAL=1 once failed runs have been retried") in result.stderr
    assert not (out / "verdict_mean_eval.json").exists()

    result = subprocess.run(["bash", str(SCRIPT), "A"], cwd=ROOT, env={**env, "FINAL": "1"}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1                                       # the failed run still failed
    verdict = json.loads((out / "verdict_mean_eval.json").read_text())["methods"]["rredcot"]["pooled"]
    assert verdict["pairs"] == 2 and verdict["mean"] == 0.05           # (0.4 - 0.3 + 0.2 - 0.2) / 2
    assert json.loads((out / "verdict_final.json").read_text())["endpoint"] == "final"
