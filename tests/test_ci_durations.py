"""Issue 40 item 5: each test lane's slowest tests are committed as `.ci/run` printed them."""

from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parents[1] / ".ci" / "durations"


@pytest.mark.parametrize("lane", ["vllm-lane", "main-lane"])
def test_each_lane_has_its_slowest_tests_and_summary_from_ci(lane):
    text = (DURATIONS / f"{lane}.txt").read_text()
    assert "slowest 25 durations" in text, f"{lane}.txt holds no --durations table; rerun .ci/run to write it"
    assert " passed" in text.rstrip().splitlines()[-1], f"{lane}.txt does not end in pytest's summary line"
    assert (DURATIONS / "MEASURED").read_text().startswith("commit "), "MEASURED names the commit it was run at"
