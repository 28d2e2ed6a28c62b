"""Issue 13: what the speed levers must leave unchanged, and the per-phase step timings."""

from __future__ import annotations

import time

import pytest

from rredcot_cli.steptime import PHASES, StepClock


def test_step_clock_counts_nested_phases_once():
    clock = StepClock()
    with clock.phase("update"):
        time.sleep(0.02)
        with clock.phase("old_logprobs"):
            time.sleep(0.03)
    assert clock.seconds["old_logprobs"] >= 0.03
    assert 0.02 <= clock.seconds["update"] < 0.03 + 0.02  # the nested 0.03 s is not in update
    assert set(clock.columns()) == {f"seconds_{p}" for p in PHASES}
    clock.reset()
    assert sum(clock.seconds.values()) == 0.0
    with pytest.raises(ValueError, match="unknown phase"):
        with clock.phase("nonsense"):
            pass


def test_resumed_history_gets_the_phase_columns():
    from rredcot_cli.stages.train import _with_phase_columns

    old = [{"step": 1, "seconds": 2.0}]
    rows = _with_phase_columns(old)
    assert rows[0]["seconds_sampling"] is None and rows[0]["credit_forward_tokens"] is None
    assert rows[0]["seconds"] == 2.0
