"""bench/long_credit.py (issue 42 item 3): the mixed case changes one sample and nothing else, and a
bad --cases gets one line and exit code 2."""

import subprocess
import sys

import pyarrow.parquet as pq
from repo_scripts import REPO, load_script

long_credit = load_script("bench/long_credit.py")


def test_mixed_case_marks_one_sample_correct_with_its_gold(tmp_path):
    step = long_credit.mixed_step(long_credit.TRACES, tmp_path / "mixed")
    saved = pq.read_table(long_credit.TRACES / "sample" / "samples.parquet").to_pylist()
    mixed = pq.read_table(step / "sample" / "samples.parquet").to_pylist()
    changed = [(a, b) for a, b in zip(saved, mixed) if a != b]
    assert len(changed) == 1 and len(mixed) == len(saved) == 16
    before, after = changed[0]
    assert (after["prompt_id"], after["sample_idx"]) == long_credit.MIXED_SAMPLE
    assert before["reward"] == 0.0 and after["reward"] == 1.0 and after["pred_answer"] == after["gold_answer"]
    group = {r["reward"] for r in mixed if r["prompt_id"] == after["prompt_id"]}
    assert group == {0.0, 1.0}  # a mixed group
    assert (step / "segment" / "segments.parquet").read_bytes() == (
        long_credit.TRACES / "segment" / "segments.parquet").read_bytes()


def test_unknown_case_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "bench/long_credit.py", "--cases", "all_wrong,mixd"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["unknown --cases mixd; valid: all_wrong, mixed"]
