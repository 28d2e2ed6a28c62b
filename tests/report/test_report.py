"""`rredcot report`: real runs of `rredcot train` (2 methods x 2 seeds on the embedded model,
made once per module) aggregated into report.md/.csv/.png; hand-computed intervals on runs
written directly; grouping by differing options; credit quality when present; one-line errors."""

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from rredcot_cli.store import artifacts
from rredcot_cli.cli import app
from rredcot_cli.report.compare import build_report

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
SMALL = [
    "benchmark.min_steps=2", "benchmark.max_steps=4", "sampling.n=2", "sampling.max_new_tokens=48",
    "train.steps=2", "train.prompts_per_step=2", "train.minibatch_size=4", "train.eval_every=1",
    "train.eval_problems=4", "train.eval_samples=2",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T_975_DF1 = 12.706204736  # Student-t 97.5% quantile, 1 degree of freedom (tables)


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-runs")
    dirs = []
    for method in ["grpo", "dr_grpo"]:
        for seed in [0, 1]:
            run = root / f"{method}-seed{seed}"  # the names scripts/compare_methods.sh uses
            result = invoke("train", f"method={method}", f"seed={seed}", f"run.dir={run}", *SMALL)
            assert result.exit_code == 0, result.output
            dirs.append(run)
    return dirs


# --------------------------------------------------------------------------- runs written directly


COMMIT = "5be240e969eb812828f38f023c50b006ebe2d36d"  # one commit for every run written directly, unless told


def write_run(run, method, seed, curve, eval_rows, summary_extra=None, config_extra=None, status="complete",
              commit=COMMIT, machines=()):
    """A finished train stage: curve maps step -> held-out pass@1 (0 = before training);
    eval_rows are (steps, correct) pairs of the final eval, one sample each, two samples per problem;
    ``commit``: the git sha its manifest records (None: not recorded); ``machines``: the manifest's
    ``machine`` records, the first attempt's then each resumed one's (none: not recorded)."""
    train = Path(run) / "train"
    train.mkdir(parents=True)
    steps = max(curve)
    config = {"seed": seed, "method": {"name": method},
              "benchmark": {"name": "chain", "eval_split": "test", "min_steps": 2, "max_steps": 4},
              "segment": {"name": "newline"}, "train": {"steps": steps}}
    for dotted, value in (config_extra or {}).items():
        group, key = dotted.split(".")
        config[group][key] = value
    (train / "config.yaml").write_text(yaml.safe_dump(config))
    manifest = {"stage": "train", "status": status, "git": {"sha": commit, "dirty": False if commit else None}}
    if machines:
        manifest |= {"machine": machines[0], "resumed": [{"found": "preempted", "machine": m} for m in machines[1:]]}
    (train / "manifest.json").write_text(json.dumps(manifest))
    artifacts.write_artifact("train_metrics", [
        {"step": s, "reward_mean": 0.5, "accuracy": 0.5, "loss": 0.0, "kl": 0.0, "entropy": 1.0, "clip_fraction": 0.0,
         "grad_norm": 1.0, "lr": 1e-5, "response_tokens_mean": 10.0, "tokens": 10 * s, "seconds": 1.0,
         "eval_accuracy": curve.get(s)} for s in range(1, steps + 1)], train / "metrics.parquet")
    artifacts.write_artifact("eval", [
        {"prompt_id": f"p{i // 2}", "sample_idx": i % 2, "completion": "", "num_tokens": 5, "pred_answer": "1",
         "gold_answer": "1", "correct": correct, "scorable": True, "steps": length, "benchmark": "chain",
         "model": "final"} for i, (length, correct) in enumerate(eval_rows)], train / "eval.parquet")
    after = curve[steps]
    summary = {"method": method, "steps": steps, "seconds": 10.0 + seed, "generated_tokens": 100 * (seed + 1),
               "eval_before": {"pass@1": curve[0], "pass@2": curve[0], "maj@2": curve[0]},
               "eval_after": {"pass@1": after, "pass@2": min(1.0, after + 0.1), "maj@2": after}}
    summary.update(summary_extra or {})
    (train / "summary.json").write_text(json.dumps(summary))
    return Path(run)


EVAL_ROWS = [(2, True), (2, True), (4, True), (4, False)]


# --------------------------------------------------------------------------- real runs


def test_report_over_real_training_runs(real_runs, tmp_path):
    out = tmp_path / "report"
    result = invoke("report", *real_runs, "--out", out)
    assert result.exit_code == 0, result.output
    for name in ["report.md", "report.csv", "final_accuracy.png", "accuracy_vs_step.png", "accuracy_by_length.png"]:
        assert (out / name).is_file(), name
    for name in ["final_accuracy.png", "accuracy_vs_step.png", "accuracy_by_length.png"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert not list(out.glob("*.tmp-*"))
    assert "dr_grpo" in result.stdout and "grpo" in result.stdout  # the rich table

    # The CSV holds one row per method, each with both seeds and the means of what train wrote.
    rows = {row["group"]: row for row in csv.DictReader((out / "report.csv").open())}
    assert set(rows) == {"grpo", "dr_grpo"}
    for method in ["grpo", "dr_grpo"]:
        summaries = [json.loads((r / "train/summary.json").read_text()) for r in real_runs if r.name.startswith(method + "-")]
        row = rows[method]
        assert row["n_seeds"] == "2" and row["seeds"] == "0 1" and row["k"] == "2"
        assert float(row["pass@1_mean"]) == pytest.approx(sum(s["eval_after"]["pass@1"] for s in summaries) / 2)
        assert float(row["maj@k_mean"]) == pytest.approx(sum(s["eval_after"]["maj@2"] for s in summaries) / 2)
        assert float(row["delta_pass@1_mean"]) == pytest.approx(
            sum(s["eval_after"]["pass@1"] - s["eval_before"]["pass@1"] for s in summaries) / 2)
        assert float(row["generated_tokens_mean"]) == pytest.approx(sum(s["generated_tokens"] for s in summaries) / 2)

    # The curve: step 0 from the eval before training, steps 1 and 2 from metrics.parquet.
    report = build_report(real_runs)
    grpo = next(g for g in report.groups if g.label == "grpo")
    assert sorted(grpo.curve) == [0, 1, 2]
    grpo_runs = [r for r in real_runs if r.name.startswith("grpo-")]
    for step in [1, 2]:
        values = [next(m["eval_accuracy"] for m in pq.read_table(r / "train/metrics.parquet").to_pylist()
                       if m["step"] == step) for r in grpo_runs]
        assert grpo.curve[step].mean == pytest.approx(sum(values) / 2)
    # Chain lengths of the final eval (problems of 2-4 steps).
    assert set(grpo.by_length) <= {2, 3, 4} and grpo.by_length

    md = (out / "report.md").read_text()
    assert "| grpo | 2 (0, 1) |" in md and "| dr_grpo | 2 (0, 1) |" in md
    assert "No credit-quality results" in md
    assert "![held-out pass@1 vs step](accuracy_vs_step.png)" in md


def test_compare_script_skips_finished_runs_and_reports(real_runs, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "METHODS": "grpo dr_grpo", "SEEDS": "0 1", "RUNS": str(real_runs[0].parent),
           "REPORT": str(tmp_path / "compare"), "RREDCOT": f"{sys.executable} -m rredcot_cli", "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(REPO / "scripts/compare_methods.sh")], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("skip ") == 4 and " train " not in result.stdout
    rows = list(csv.DictReader((tmp_path / "compare/report.csv").open()))
    assert sorted((r["group"], r["seeds"]) for r in rows) == [("dr_grpo", "0 1"), ("grpo", "0 1")]
    log = (tmp_path / "compare/compare_methods.txt").read_text()
    assert "METHODS=grpo dr_grpo SEEDS=0 1" in log and "total wall time" in log


def test_unfinished_real_run_is_named(real_runs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(real_runs[0] / "train", broken / "train", ignore=shutil.ignore_patterns("checkpoints"))
    (broken / "train" / "summary.json").unlink()
    result = invoke("report", real_runs[1], broken, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert str(broken / "train") in result.stderr and "missing summary.json" in result.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- runs written directly


def test_intervals_are_student_t_over_seeds(tmp_path):
    a = write_run(tmp_path / "a", "grpo", 0, {0: 0.4, 1: 0.5, 2: 0.6}, EVAL_ROWS)
    b = write_run(tmp_path / "b", "grpo", 1, {0: 0.4, 1: 0.7, 2: 0.8},
                  [(2, True), (2, False), (4, False), (4, False)])
    report = build_report([a, b])
    [group] = report.groups
    # Step 1: 0.5 and 0.7 -> mean 0.6, sd 0.1414, half-width t(0.975, 1) * 0.1414 / sqrt(2) = 12.706 * 0.1.
    assert group.curve[1].mean == pytest.approx(0.6)
    assert group.curve[1].half_width() == pytest.approx(T_975_DF1 * 0.1, rel=1e-6)
    assert group.curve[0].half_width() == pytest.approx(0.0)
    assert group.pass1.mean == pytest.approx(0.7)
    assert group.delta_pass1.mean == pytest.approx(0.3)
    assert group.delta_pass1.half_width() == pytest.approx(T_975_DF1 * 0.1, rel=1e-6)
    # By chain length: run a 2/2 and 1/2 correct, run b 1/2 and 0/2.
    assert group.by_length[2].mean == pytest.approx(0.75)
    assert group.by_length[4].mean == pytest.approx(0.25)
    assert group.seconds.mean == pytest.approx(10.5) and group.generated_tokens.mean == pytest.approx(150)
    md_row = f"| grpo | 2 (0, 1) | 0.700 ± {T_975_DF1 * 0.1:.3f} | +0.300 ± {T_975_DF1 * 0.1:.3f} |"
    out = tmp_path / "out"
    assert invoke("report", a, b, "--out", out).exit_code == 0
    assert md_row in (out / "report.md").read_text()


def test_paired_differences_and_sample_efficiency_against_grpo(tmp_path):
    """rredcot vs grpo, seed by seed: final pass@1 0.8 vs 0.6 (seed 0) and 0.7 vs 0.6 (seed 1) ->
    differences 0.2 and 0.1: mean 0.15, sd 0.0707, half-width t(0.975, 1) * 0.0707 / sqrt(2) =
    12.706 * 0.05. grpo's mean final pass@1 is 0.6: rredcot seed 0 reaches it at step 2 (10
    tokens per step -> 20), seed 1 at step 4 (40); both grpo seeds at step 4."""
    runs = [write_run(tmp_path / "g0", "grpo", 0, {0: 0.4, 2: 0.5, 4: 0.6}, EVAL_ROWS),
            write_run(tmp_path / "g1", "grpo", 1, {0: 0.4, 2: 0.55, 4: 0.6}, EVAL_ROWS),
            write_run(tmp_path / "r0", "rredcot", 0, {0: 0.4, 2: 0.6, 4: 0.8}, EVAL_ROWS),
            write_run(tmp_path / "r1", "rredcot", 1, {0: 0.4, 2: 0.5, 4: 0.7}, EVAL_ROWS),
            write_run(tmp_path / "l2", "rloo", 2, {0: 0.4, 2: 0.5, 4: 0.5}, EVAL_ROWS)]
    report = build_report(runs)
    assert report.baseline == "grpo"
    paired = {row.label: row for row in report.paired}
    rredcot = paired["rredcot"]
    assert rredcot.seeds == [0, 1] and rredcot.target == pytest.approx(0.6)
    assert rredcot.difference.mean == pytest.approx(0.15)
    assert rredcot.difference.half_width() == pytest.approx(T_975_DF1 * 0.05, rel=1e-6)
    assert rredcot.reached == 2 and rredcot.steps_to_target.mean == pytest.approx(3.0)
    assert rredcot.tokens_to_target.mean == pytest.approx(30.0)
    assert paired["grpo"].reached == 2 and paired["grpo"].steps_to_target.mean == pytest.approx(4.0)
    rloo = paired["rloo"]  # no seed in common with grpo, never reaches 0.6
    assert rloo.seeds == [] and rloo.reached == 0 and rloo.steps_to_target is None
    out = tmp_path / "out"
    assert invoke("report", *runs, "--out", out).exit_code == 0
    md = (out / "report.md").read_text()
    assert "## Paired against grpo" in md
    assert f"| rredcot | 0, 1 | +0.150 [{0.15 - T_975_DF1 * 0.05:+.3f}, {0.15 + T_975_DF1 * 0.05:+.3f}] |" in md
    assert "| rloo |  | no common seed | — | 0/1 | — | — |" in md
    # Another baseline by label; an unknown one is refused with the labels there are.
    assert {row.label for row in build_report(runs, baseline="rloo").paired} == {"grpo", "rloo", "rredcot"}
    bad = invoke("report", *runs, "--out", out, "--baseline", "ppo")
    assert bad.exit_code != 0 and "groups: grpo, rloo, rredcot" in bad.output
    assert "## Advantages" not in md  # these runs predate the column


def _mixed_commit_runs(tmp_path):
    """grpo at 5be240e (seeds 0, 1); rredcot seed 0 at b0dd4db, seed 1 at 5be240e; rloo seed 0 with no
    recorded commit (as in the toy R1 pairs of issue 39)."""
    return [write_run(tmp_path / "g0", "grpo", 0, {0: 0.4, 2: 0.6}, EVAL_ROWS),
            write_run(tmp_path / "g1", "grpo", 1, {0: 0.4, 2: 0.6}, EVAL_ROWS),
            write_run(tmp_path / "r0", "rredcot", 0, {0: 0.4, 2: 0.8}, EVAL_ROWS,
                      commit="b0dd4db07d8d986e50a670d34fbac962413cb88d"),
            write_run(tmp_path / "r1", "rredcot", 1, {0: 0.4, 2: 0.7}, EVAL_ROWS),
            write_run(tmp_path / "l0", "rloo", 0, {0: 0.4, 2: 0.5}, EVAL_ROWS, commit=None)]


def test_pairs_across_commits_are_refused_with_a_warning(tmp_path):
    runs = _mixed_commit_runs(tmp_path)
    report = build_report(runs)
    assert [row.label for row in report.paired] == ["grpo"]  # the baseline against itself only
    refused = {row.label: row.cross_commit for row in report.refused}
    assert refused == {"rredcot": [(0, "b0dd4db07d8d986e50a670d34fbac962413cb88d", COMMIT)],
                       "rloo": [(0, None, COMMIT)]}
    out = tmp_path / "out"
    result = invoke("report", *runs, "--out", out)
    assert result.exit_code == 0, result.output
    warning = ("warning: rredcot vs grpo: pairs ran on different or unknown commits (seed 0: b0dd4db vs 5be240e), "
               "so they are not common-random-number pairs; left out of the paired section; rerun both arms at "
               "one commit, or pass --allow-mixed-commits to show it flagged")
    assert warning in result.output.splitlines()
    assert ("warning: rloo vs grpo: pairs ran on different or unknown commits (seed 0: unknown vs 5be240e)"
            in result.output)
    md = (out / "report.md").read_text()
    paired = md.split("## Paired against grpo")[1].split("\n## ")[0]
    assert "| grpo | 0, 1 |" in paired and "| rredcot |" not in paired and "| rloo |" not in paired
    assert "**⚠ Refused:** rredcot vs grpo: pairs ran on different or unknown commits (seed 0: b0dd4db vs 5be240e)" in md
    assert "| rredcot | 0 | 2 | 0.400 | 0.800 | 10 | 100 | b0dd4db |" in md  # the runs table names each run's commit
    assert "| rloo | 0 | 2 | 0.400 | 0.500 | 10 | 100 | unknown |" in md


def test_allow_mixed_commits_keeps_the_pairs_flagged(tmp_path):
    runs = _mixed_commit_runs(tmp_path)
    report = build_report(runs, allow_mixed_commits=True)
    assert {row.label for row in report.paired} == {"grpo", "rredcot", "rloo"} and not report.refused
    out = tmp_path / "out"
    result = invoke("report", *runs, "--out", out, "--allow-mixed-commits")
    assert result.exit_code == 0, result.output
    assert ("warning: rredcot vs grpo: pairs ran on different or unknown commits (seed 0: b0dd4db vs 5be240e), so "
            "they are not common-random-number pairs; shown flagged (--allow-mixed-commits)") in result.output
    md = (out / "report.md").read_text()
    assert "| rredcot ⚠ MIXED COMMITS | 0, 1 | +0.150" in md
    assert "| rloo ⚠ MIXED COMMITS | 0 | -0.100" in md
    assert "**⚠ Mixed commits:** rredcot vs grpo" in md


def test_pairs_across_machines_are_kept_and_named(tmp_path):
    x = {"cpu": "Intel Xeon", "cpu_count": 2, "torch_cpu_capability": "AVX2"}
    y = {"cpu": "AMD EPYC", "cpu_count": 2, "torch_cpu_capability": "AVX512"}
    runs = [write_run(tmp_path / "g0", "grpo", 0, {0: 0.4, 2: 0.6}, EVAL_ROWS, machines=[x]),
            write_run(tmp_path / "g1", "grpo", 1, {0: 0.4, 2: 0.6}, EVAL_ROWS, machines=[x]),
            write_run(tmp_path / "g2", "grpo", 2, {0: 0.4, 2: 0.6}, EVAL_ROWS, machines=[x]),
            write_run(tmp_path / "r0", "rredcot", 0, {0: 0.4, 2: 0.8}, EVAL_ROWS, machines=[y]),
            write_run(tmp_path / "r1", "rredcot", 1, {0: 0.4, 2: 0.7}, EVAL_ROWS, machines=[x, y, x]),
            write_run(tmp_path / "r2", "rredcot", 2, {0: 0.4, 2: 0.7}, EVAL_ROWS, machines=[x, x]),
            write_run(tmp_path / "l0", "rloo", 0, {0: 0.4, 2: 0.5}, EVAL_ROWS)]  # no machine recorded
    report = build_report(runs)
    assert not report.refused  # the same commit: kept, whatever the CPUs
    crossed = {row.label: row.cross_machine for row in report.paired}
    assert crossed == {"grpo": [], "rloo": [],  # unknown is not "different"
                       "rredcot": [(0, ("AMD EPYC (AVX512)",), ("Intel Xeon (AVX2)",)),
                                   (1, ("Intel Xeon (AVX2)", "AMD EPYC (AVX512)"), ("Intel Xeon (AVX2)",))]}
    out = tmp_path / "out"
    assert invoke("report", *runs, "--out", out).exit_code == 0
    md = (out / "report.md").read_text()
    assert ("**Machines:** rredcot vs grpo: 2 of 3 pairs ran on different CPUs (seed 0: AMD EPYC (AVX512) vs "
            "Intel Xeon (AVX2); seed 1: Intel Xeon (AVX2), then AMD EPYC (AVX512) vs Intel Xeon (AVX2)).") in md
    assert "| b0dd4db" not in md and "| 5be240e | Intel Xeon (AVX2), then AMD EPYC (AVX512) |" in md
    assert "| 5be240e | unknown |" in md and "rloo vs grpo: " not in md


def test_pairs_on_one_commit_are_not_flagged(tmp_path):
    runs = [write_run(tmp_path / f"{m}{s}", m, s, {0: 0.4, 2: 0.6}, EVAL_ROWS) for m in ("grpo", "rredcot")
            for s in (0, 1)]
    result = invoke("report", *runs, "--out", tmp_path / "out")
    assert result.exit_code == 0 and "warning" not in result.output
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| rredcot | 0, 1 | +0.000" in md and "⚠" not in md


def test_advantage_spread_section(tmp_path):
    from rredcot_cli.store import artifacts

    runs = [write_run(tmp_path / f"g{seed}", "grpo", seed, {0: 0.4, 2: 0.6}, EVAL_ROWS) for seed in (0, 1)]
    for run, stds in zip(runs, ([0.5, 1.5], [1.0, 2.0])):  # run means 1.0 and 1.5 -> 1.25
        path = run / "train" / "metrics.parquet"
        rows = artifacts.read_artifact("train_metrics", path).to_pylist()
        artifacts.write_artifact("train_metrics", [{**r, "advantage_std": v} for r, v in zip(rows, stds)], path)
    out = tmp_path / "out"
    assert invoke("report", *runs, "--out", out).exit_code == 0
    assert f"| grpo | 1.250 ± {T_975_DF1 * 0.25:.3f} |" in (out / "report.md").read_text()


def test_single_seed_has_no_interval(tmp_path):
    a = write_run(tmp_path / "a", "grpo", 0, {0: 0.4, 2: 0.6}, EVAL_ROWS)
    out = tmp_path / "out"
    assert invoke("report", a, "--out", out).exit_code == 0
    [row] = list(csv.DictReader((out / "report.csv").open()))
    assert row["pass@1_mean"] == "0.6" and row["pass@1_ci_low"] == "" and row["n_seeds"] == "1"
    assert "| grpo | 1 (0) | 0.600 | +0.200 |" in (out / "report.md").read_text()


def test_groups_split_by_differing_options_not_by_seed(tmp_path):
    runs = [
        write_run(tmp_path / "g0", "grpo", 0, {0: 0.5, 1: 0.5}, EVAL_ROWS),
        write_run(tmp_path / "g1", "grpo", 1, {0: 0.5, 1: 0.6}, EVAL_ROWS),
        write_run(tmp_path / "r0", "rredcot", 0, {0: 0.5, 1: 0.7}, EVAL_ROWS,
                  config_extra={"segment.name": "fixed", "method.value": "suffix_is"}),
        write_run(tmp_path / "r1", "rredcot", 0, {0: 0.5, 1: 0.8}, EVAL_ROWS,
                  config_extra={"segment.name": "fixed", "method.value": "answer_probe"}),
    ]
    labels = {g.label: [r.seed for r in g.runs] for g in build_report(runs).groups}
    # segment.name differs, but newline is its default: only the runs set apart show it.
    assert labels == {
        "grpo": [0, 1],
        "rredcot · method.value=answer_probe · segment.name=fixed": [0],
        "rredcot · method.value=suffix_is · segment.name=fixed": [0],
    }


def test_a_data_order_seed_that_follows_the_seed_does_not_split_groups(tmp_path):
    """train.data_order_seed is part of a run's seed (issue 39 sets it to the seed), not of its arm:
    runs whose data order is shuffled group together whatever its value, and pair by seed; only
    shuffled against unshuffled runs are set apart."""
    runs = [write_run(tmp_path / f"{m}{s}", m, s, {0: 0.5, 1: 0.5 + 0.1 * s}, EVAL_ROWS,
                      config_extra={"train.data_order_seed": s})
            for m in ("grpo", "rredcot") for s in (0, 1)]
    report = build_report(runs)
    assert {g.label: [r.seed for r in g.runs] for g in report.groups} == {"grpo": [0, 1], "rredcot": [0, 1]}
    assert [row.seeds for row in report.paired if row.label == "rredcot"] == [[0, 1]]
    unshuffled = write_run(tmp_path / "plain", "grpo", 2, {0: 0.5, 1: 0.5}, EVAL_ROWS)
    labels = {g.label: [r.seed for r in g.runs] for g in build_report([*runs, unshuffled]).groups}
    assert labels == {"grpo": [2], "grpo · train.data_order_seed=per seed": [0, 1],
                      "rredcot · train.data_order_seed=per seed": [0, 1]}


def test_an_option_older_runs_lack_has_its_default(tmp_path):
    old = write_run(tmp_path / "old", "grpo", 0, {0: 0.5, 1: 0.5}, EVAL_ROWS)
    config = yaml.safe_load((old / "train" / "config.yaml").read_text())
    config["train"].pop("dynamic_sampling", None)  # written before the option existed
    (old / "train" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = [
        old,
        write_run(tmp_path / "new", "grpo", 1, {0: 0.5, 1: 0.6}, EVAL_ROWS,
                  config_extra={"train.dynamic_sampling": False}),
        write_run(tmp_path / "ds", "dapo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS,
                  config_extra={"train.dynamic_sampling": True}),
    ]
    labels = {g.label: [r.seed for r in g.runs] for g in build_report(runs).groups}
    assert labels == {"grpo": [0, 1], "dapo · train.dynamic_sampling=True": [0]}


def test_a_method_option_older_runs_lack_has_the_value_they_ran_with(tmp_path):
    """rredcot's window was in tokens before is_window_unit existed (segments is today's default):
    a run without the key groups with runs that say tokens, apart from runs in segments."""
    window = {"method.value": "suffix_is", "method.is_window": 64}
    runs = [
        write_run(tmp_path / "old", "rredcot", 0, {0: 0.5, 1: 0.5}, EVAL_ROWS, config_extra=window),
        write_run(tmp_path / "new", "rredcot", 1, {0: 0.5, 1: 0.6}, EVAL_ROWS,
                  config_extra={**window, "method.is_window_unit": "tokens"}),
        write_run(tmp_path / "seg", "rredcot", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS,
                  config_extra={"method.value": "suffix_is", "method.is_window": 1, "method.is_window_unit": "segments"}),
    ]
    labels = {g.label: [r.seed for r in g.runs] for g in build_report(runs).groups}
    assert labels == {
        "rredcot · method.is_window=64 · method.is_window_unit=tokens": [0, 1],
        "rredcot · method.is_window=1 · method.is_window_unit=segments": [0],
    }


def test_credit_quality_table_when_a_run_has_one(tmp_path):
    import pyarrow as pa

    a = write_run(tmp_path / "a", "rredcot", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS)
    b = write_run(tmp_path / "b", "rredcot", 1, {0: 0.5, 1: 0.6}, EVAL_ROWS)
    for run, spearman in [(a, [0.1, 0.3]), (b, [0.4, 0.4])]:
        (run / "judge").mkdir()
        pq.write_table(pa.table({"prompt_id": ["p0", "p1"], "method": ["rredcot", "rredcot"],
                                 "spearman_mc": spearman, "first_error_hit": [True, False]}),
                       run / "judge" / "quality.parquet")
    out = tmp_path / "out"
    assert invoke("report", a, b, "--out", out).exit_code == 0
    md = (out / "report.md").read_text()
    assert "From `judge/quality.parquet`" in md
    # spearman: run a 0.2, run b 0.4 -> 0.3 ± t * 0.1414 / sqrt(2); first_error_hit 0.5 in both runs.
    assert f"| rredcot | rredcot | 0.300 ± {T_975_DF1 * 0.1:.3f} | 0.500 ± 0.000 |" in md
    rows = list(csv.DictReader((out / "credit_quality.csv").open()))
    assert {r["measure"]: float(r["mean"]) for r in rows} == pytest.approx({"spearman_mc": 0.3, "first_error_hit": 0.5})
    assert {(r["group"], r["keys"], r["n_runs"]) for r in rows} == {("rredcot", "method=rredcot", "2")}

    # Reported again without credit quality: the section says so and the old CSV is gone.
    c = write_run(tmp_path / "c", "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS)
    assert invoke("report", c, "--out", out).exit_code == 0
    assert "No credit-quality results" in (out / "report.md").read_text()
    assert not (out / "credit_quality.csv").exists()


# --------------------------------------------------------------------------- errors


def test_run_dir_without_train_stage_is_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = invoke("report", empty, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr == f"error: {empty} has no finished train stage: no train/ folder " \
                            f"(run `rredcot train run.dir={empty}` first)\n"


def test_unfinished_manifest_is_refused(tmp_path):
    a = write_run(tmp_path / "a", "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS, status="running")
    result = invoke("report", a, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "status 'running'" in result.stderr and str(a / "train") in result.stderr
    assert "Traceback" not in result.output


def test_skip_unfinished_leaves_out_and_names_unfinished_run_dirs(tmp_path):
    """A sweep with a cell still running and a cell that never started training: --skip-unfinished
    reports the finished runs and names the others in one line (and at the end of report.md)."""
    a = write_run(tmp_path / "grpo-seed0", "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS)
    b = write_run(tmp_path / "grpo-seed1", "grpo", 1, {0: 0.5, 1: 0.7}, EVAL_ROWS)
    running = write_run(tmp_path / "rredcot-seed0", "rredcot", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS, status="running")
    never = tmp_path / "rredcot-seed1"
    (never / "sample").mkdir(parents=True)
    out = tmp_path / "out"
    refused = invoke("report", a, b, running, never, "--out", out)
    assert refused.exit_code == 2 and "or pass --skip-unfinished" in refused.stderr
    result = invoke("report", a, b, running, never, "--out", out, "--skip-unfinished")
    assert result.exit_code == 0, result.output
    assert result.stderr == f"skipping 2 unfinished run dir(s) (train did not finish): {running}, {never}\n"
    report = (out / "report.md").read_text()
    assert "2 training runs in 1 groups" in report
    assert f"Left out (`--skip-unfinished`; their train stage did not finish): `{running}`, `{never}`." in report
    [row] = list(csv.DictReader((out / "report.csv").open()))
    assert (row["method"], row["seeds"]) == ("grpo", "0 1")


def test_skip_unfinished_still_refuses_missing_paths_and_all_unfinished(tmp_path):
    running = write_run(tmp_path / "a", "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS, status="running")
    missing = invoke("report", running, tmp_path / "typo", "--out", tmp_path / "out", "--skip-unfinished")
    assert missing.exit_code == 2 and missing.stderr == f"error: {tmp_path / 'typo'}: no such run directory\n"
    none_left = invoke("report", running, "--out", tmp_path / "out", "--skip-unfinished")
    assert none_left.exit_code == 2
    assert none_left.stderr == f"error: none of the 1 run dir(s) has a finished train stage ({running}); " \
                               "nothing to report\n"
    assert not (tmp_path / "out").exists()


def test_mixed_benchmarks_are_refused(tmp_path):
    a = write_run(tmp_path / "a", "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS)
    b = write_run(tmp_path / "b", "grpo", 1, {0: 0.5, 1: 0.6}, EVAL_ROWS, config_extra={"benchmark.name": "gsm8k"})
    result = invoke("report", a, b, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "mix benchmarks" in result.stderr and "benchmark.name=chain vs gsm8k" in result.stderr
    assert str(a) in result.stderr and str(b) in result.stderr


def test_importing_the_cli_does_not_import_matplotlib():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    code = "import sys, rredcot_cli.cli; sys.exit('matplotlib' in sys.modules or 'pyarrow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


def test_curve_falls_back_to_final_eval_without_periodic_evals(tmp_path):
    a = write_run(tmp_path / "a", "grpo", 0, {0: 0.5, 1: 0.6}, EVAL_ROWS)
    metrics = artifacts.read_artifact("train_metrics", a / "train/metrics.parquet").to_pylist()
    for row in metrics:
        row["eval_accuracy"] = None  # train.eval_every=0
    artifacts.write_artifact("train_metrics", metrics, a / "train/metrics.parquet")
    [group] = build_report([a]).groups
    assert {s: st.mean for s, st in group.curve.items()} == {0: 0.5, 1: 0.6}
    assert not math.isnan(group.pass1.mean)
