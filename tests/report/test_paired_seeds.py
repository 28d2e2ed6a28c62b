"""bench/paired_seeds.py: pairs within a folder by seed, pools folders, leaves unpaired seeds out."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def paired():
    return load_script("bench/paired_seeds.py")


COMMIT = "fd4b0cfa74f6cfa0f17f1c46831fbbbbd9559188"


def _study(root, finals: dict, commits: dict | None = None, machines: dict | None = None) -> str:
    """Run folders with final pass@1 ``finals[(method, seed)]``, on ``COMMIT`` unless ``commits``
    names another sha (None: no sha recorded); ``machines[(method, seed)]``: the manifest's machine
    records, the first attempt's then each resumed one's (none: not recorded)."""
    for (method, seed), pass1 in finals.items():
        train = root / f"{method}-lr1e-5-seed{seed}" / "train"
        train.mkdir(parents=True)
        (train / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": pass1}}))
        sha = (commits or {}).get((method, seed), COMMIT)
        manifest = {"stage": "train", "git": {"sha": sha, "dirty": False}}
        if records := (machines or {}).get((method, seed)):
            manifest |= {"machine": records[0], "resumed": [{"machine": m} for m in records[1:]]}
        (train / "manifest.json").write_text(json.dumps(manifest))
    return str(root)


def test_pairs_and_pooling_by_hand(paired, tmp_path):
    a = _study(tmp_path / "a", {("grpo", 0): 0.5, ("x", 0): 0.6, ("grpo", 1): 0.5, ("x", 1): 0.4,
                                ("x", 2): 0.9})                      # seed 2 has no grpo: left out
    b = _study(tmp_path / "b", {("grpo", 0): 0.7, ("x", 0): 0.7})    # seed 0 again, another folder
    report = paired.main([a, b, "--methods", "x"])["methods"]["x"]
    assert report["folders"][a]["diffs"] == {0: 0.1, 1: -0.1}
    assert report["folders"][a]["pairs"] == 2 and report["folders"][a]["mean"] == 0.0
    assert report["folders"][b] == {"diffs": {0: 0.0}, "pairs": 1}
    pooled = report["pooled"]
    assert pooled["pairs"] == 3 and pooled["mean"] == 0.0
    # 95% t interval, df 2: 4.303 x sd 0.1 / sqrt 3
    assert pooled["high"] == pytest.approx(4.3027 * 0.1 / 3 ** 0.5, abs=1e-4) and pooled["low"] == -pooled["high"]


def test_a_folder_without_runs_is_one_line(paired, tmp_path):
    with pytest.raises(SystemExit, match="no <method>-lr<lr>-seed<s>/train/summary.json"):
        paired.main([str(tmp_path), "--methods", "x"])


def test_pairs_across_commits_are_refused_unless_allowed(paired, tmp_path, capsys):
    a = _study(tmp_path / "a", {("grpo", 0): 0.5, ("x", 0): 0.6, ("grpo", 1): 0.5, ("x", 1): 0.4},
               commits={("x", 0): "b0dd4db07d8d986e50a670d34fbac962413cb88d", ("x", 1): None})
    with pytest.raises(SystemExit) as info:
        paired.main([a, "--methods", "x"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {a}: x vs grpo pairs ran on different or unknown commits (seed 0: b0dd4db vs fd4b0cf, seed 1: "
        "unknown vs fd4b0cf), so they are not common-random-number pairs; rerun both arms at one commit, or pass "
        "--allow-mixed-commits to keep them (listed under mixed_commits)")
    report = paired.main([a, "--methods", "x", "--allow-mixed-commits"])["methods"]["x"]["folders"][a]
    assert report["diffs"] == {0: 0.1, 1: -0.1}
    assert report["mixed_commits"] == [{"seed": 0, "x": "b0dd4db", "grpo": "fd4b0cf"},
                                       {"seed": 1, "x": "unknown", "grpo": "fd4b0cf"}]


def test_pairs_across_machines_are_kept_and_listed(paired, tmp_path, capsys):
    x = {"cpu": "Intel Xeon", "torch_cpu_capability": "AVX2"}
    y = {"cpu": "AMD EPYC", "torch_cpu_capability": "AVX512"}
    a = _study(tmp_path / "a", {("grpo", s): 0.5 for s in range(4)} | {("x", s): 0.6 for s in range(4)},
               machines={("grpo", 0): [x], ("x", 0): [y],         # across
                         ("grpo", 1): [x], ("x", 1): [x, y],      # resumed elsewhere
                         ("grpo", 2): [x], ("x", 2): [x, x],      # one CPU
                         ("grpo", 3): [x]})                       # x's CPU not recorded: not named
    report = paired.main([a, "--methods", "x"])["methods"]["x"]["folders"][a]
    assert report["pairs"] == 4  # kept
    assert report["cross_machine"] == [{"seed": 0, "x": "AMD EPYC (AVX512)", "grpo": "Intel Xeon (AVX2)"},
                                       {"seed": 1, "x": "Intel Xeon (AVX2), then AMD EPYC (AVX512)",
                                        "grpo": "Intel Xeon (AVX2)"}]
    assert capsys.readouterr().err.strip() == (
        f"note: {a}: x vs grpo: 2 of 4 pairs ran on different CPUs (listed under cross_machine); kept: unbiased, "
        "but not bit-identical pairs")


def _curves(root, curves: dict) -> str:
    """Run folders whose held-out evals are ``curves[(method, seed)] = {step: pass@1}`` (the last
    step is the final eval, ``eval_after``), all on ``COMMIT``."""
    for (method, seed), curve in curves.items():
        train = root / f"{method}-lr1e-5-seed{seed}" / "train"
        train.mkdir(parents=True)
        last = max(curve)
        (train / "summary.json").write_text(json.dumps({"steps": last, "eval_after": {"pass@1": curve[last]}}))
        (train / "manifest.json").write_text(json.dumps({"stage": "train", "git": {"sha": COMMIT, "dirty": False}}))
        steps = list(range(1, last + 1))
        pq.write_table(pa.table({"step": steps, "eval_accuracy": [curve.get(s) for s in steps]}),
                       train / "metrics.parquet")
    return str(root)


def test_mean_eval_endpoint_is_the_area_under_the_eval_curve(paired, tmp_path):
    a = _curves(tmp_path, {("grpo", 0): {5: 0.3, 10: 0.5}, ("x", 0): {5: 0.5, 10: 0.5},
                           ("grpo", 1): {5: 0.2, 10: 0.4}, ("x", 1): {5: 0.2, 10: 0.6}})
    final = paired.main([a, "--methods", "x"])["methods"]["x"]["folders"][a]["diffs"]
    assert final == {0: 0.0, 1: 0.2}
    area = paired.main([a, "--methods", "x", "--endpoint", "mean-eval"])
    assert area["endpoint"] == "mean-eval"
    assert area["methods"]["x"]["folders"][a]["diffs"] == {0: 0.1, 1: 0.1}   # (0.5+0.5)/2 - (0.3+0.5)/2, ...


def test_mean_eval_refuses_runs_evaluated_at_different_steps(paired, tmp_path, capsys):
    a = _curves(tmp_path, {("grpo", 0): {5: 0.3, 10: 0.5}, ("x", 0): {10: 0.5}})
    with pytest.raises(SystemExit) as info:
        paired.main([a, "--methods", "x", "--endpoint", "mean-eval"])
    assert info.value.code == 2
    assert "runs evaluated at different steps (grpo-seed0: [5, 10]; x-seed0: [10])" in capsys.readouterr().err


def test_sign_flip_p_by_hand(paired):
    # sums of +-0.1 +-0.2 +-0.3: 0.6, 0.4, 0.2, 0, 0, -0.2, -0.4, -0.6: two of eight reach |0.6|
    assert paired.sign_flip_p([0.1, 0.2, 0.3]) == (0.25, None)
    assert paired.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == (2 / 64, None)
    # twenty pairs: all 2^20 flips; +-0.05 alternating sums to 0, which every flip reaches
    assert paired.sign_flip_p([0.05, -0.05] * 10) == (1.0, None)
    # past twenty: Monte Carlo; 21 positive pairs have p = 2 / 2^21, so almost no random flip reaches it
    p, flips = paired.sign_flip_p([0.1] * 21)
    assert flips == paired.MONTE_CARLO_FLIPS and p <= 3 / (flips + 1)


def test_tost_and_detectable_effect_by_hand(paired):
    # mean 0, sd 0.01 * sqrt(4/3), se 0.01/sqrt(3): t = 0.03 / se = 3 sqrt(3), df 3, whose upper tail is
    # 1/2 - (atan(3) + 3/10) / pi = 0.0069244 (the closed form of Student's t with 3 df)
    diffs = [0.01, -0.01, 0.01, -0.01]
    assert paired.tost_p(diffs, 0.03) == pytest.approx(0.5 - (math.atan(3) + 0.3) / math.pi, abs=1e-9)
    # twenty pairs of sd 0.05 sqrt(20/19): (t_.975,19 2.0930 + t_.80,19 0.8610) x sd / sqrt(20)
    assert paired.mde([0.05, -0.05] * 10) == pytest.approx(2.9540 * 0.05 * (20 / 19) ** 0.5 / 20 ** 0.5, abs=2e-4)


def test_the_registered_verdicts(paired):
    def verdict(diffs):
        return paired.tests(diffs, 0.03)["verdict"]
    assert verdict([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == "helps"                         # p = 2/64, mean > 0
    assert verdict([-0.1, -0.12, -0.14, -0.1, -0.12, -0.14]) == "no gain beyond the margin (trails)"
    assert verdict([0.01, -0.01, 0.01, -0.01]) == "no gain beyond the margin (equivalent)"  # high 0.018
    assert verdict([0.1, 0.2, 0.3]) == "unresolved"                                  # p = 0.25, high > 0.03
