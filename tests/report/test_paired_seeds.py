"""bench/paired_seeds.py: pairs within a folder by seed, pools folders, leaves unpaired seeds out."""

import json

import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def paired():
    return load_script("bench/paired_seeds.py")


COMMIT = "fd4b0cfa74f6cfa0f17f1c46831fbbbbd9559188"


def _study(root, finals: dict, commits: dict | None = None) -> str:
    """Run folders with final pass@1 ``finals[(method, seed)]``, on ``COMMIT`` unless ``commits``
    names another sha (None: no sha recorded)."""
    for (method, seed), pass1 in finals.items():
        train = root / f"{method}-lr1e-5-seed{seed}" / "train"
        train.mkdir(parents=True)
        (train / "summary.json").write_text(json.dumps({"eval_after": {"pass@1": pass1}}))
        sha = (commits or {}).get((method, seed), COMMIT)
        (train / "manifest.json").write_text(json.dumps({"stage": "train", "git": {"sha": sha, "dirty": False}}))
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
