"""The pre-registration (docs/where-credit-pays.md) and its driver (scripts/where_credit_pays.sh)
cannot drift apart: the document embeds results/where-credit-pays/protocol.json verbatim, and the
script's dry run lists exactly the registered arms, seeds, budget, rate grid and statistics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "where-credit-pays.md"
PROTOCOL = ROOT / "results" / "where-credit-pays" / "protocol.json"
SCRIPT = ROOT / "scripts" / "where_credit_pays.sh"


# An empty results folder of its own, so that sweeps finished in a developer's runs/ cannot change
# what the dry run prints.
RESULTS = "runs/where-credit-pays-dry-run-test"


def dry_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "RESULTS": RESULTS}
    env.pop("PROTOCOL", None)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def protocol() -> dict:
    return json.loads(PROTOCOL.read_text())


def test_the_document_embeds_the_protocol_verbatim():
    blocks = re.findall(r"<!-- protocol.json -->\n```json\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/where-credit-pays.md must hold one ```json block after <!-- protocol.json -->"
    assert blocks[0] == PROTOCOL.read_text()


def _commands(output: str, head: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.split()[1:3] == head.split()]


def test_the_dry_run_lists_the_registered_study(protocol):
    setting = protocol["settings"]["A"]
    result = dry_run("A")
    assert result.returncode == 0, result.stderr
    budget, arms, seeds = setting["budget"], setting["arms"], setting["eval_seeds"]
    assert len(seeds) == 20 and len(arms) == 2

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
        arm = next(a for a in arms if f"run.dir={RESULTS}/A/runs/{a}-lrLR_FROM_SWEEP-seed" in " ".join(train))
        seed = int(next(t for t in train if t.startswith("seed=")).split("=")[1])
        assert train[4 + len(budget):4 + len(budget) + len(arms[arm])] == arms[arm]
        assert f"train.data_order_seed={seed}" in train and "train.resume=true" in train
        expected.discard((arm, seed))
    assert not expected, f"arm/seed pairs without a run: {sorted(expected)}"

    verdicts = _commands(result.stdout, f"bench/paired_seeds.py {RESULTS}/A/runs")
    stats = protocol["statistics"]
    assert [v[v.index("--endpoint") + 1] for v in verdicts] == [protocol["endpoint"]["primary"], protocol["endpoint"]["secondary"]]
    for verdict in verdicts:
        assert verdict[verdict.index("--margin") + 1] == format(stats["margin"], "g")
        assert verdict[verdict.index("--baseline") + 1] == stats["baseline"]
        assert stats["primary_comparison"] in verdict


def test_the_further_arms_dry_run(protocol):
    result = dry_run("A", "further")
    assert result.returncode == 0, result.stderr
    further = protocol["settings"]["A"]["further_arms"]
    assert f"further arms: {' '.join(further)};" in result.stdout
    trains = _commands(result.stdout, "-m rredcot_cli")
    assert len(trains) == len(further) * len(protocol["settings"]["A"]["eval_seeds"])


def test_settings_registered_as_future_work_are_refused_in_one_line(protocol):
    for name, setting in protocol["settings"].items():
        if setting["status"] != "registered":
            result = dry_run(name)
            assert result.returncode == 2
            assert result.stderr.strip() == (f"error: setting {name} is registered as 'future work' in "
                                             "results/where-credit-pays/protocol.json (docs/where-credit-pays.md "
                                             "says what it needs); run setting A")
