"""bench/hf_tail_step.py (issue 42 item 2): how a decode's forward calls become steps and buckets by
rows (the times themselves are the machine's, never asserted)."""

from repo_scripts import load_script

tail = load_script("bench/hf_tail_step.py")


def test_a_step_runs_from_its_forward_to_the_next_and_the_prefill_is_no_step():
    calls = [(8, 0.0, 5.0), (32, 6.0, 7.0), (32, 7.5, 8.0), (24, 9.0, 9.5)]  # (rows, start, end)
    steps = tail.decode_steps(calls, call_end=10.0)
    assert steps == [{"rows": 32, "step_s": 1.5, "forward_s": 1.0}, {"rows": 32, "step_s": 1.5, "forward_s": 0.5},
                     {"rows": 24, "step_s": 1.0, "forward_s": 0.5}]
    buckets = tail.by_rows(steps)
    assert list(buckets) == [32, 24]
    assert buckets[32] == {"steps": 2, "step_s": 1.5, "forward_s": 0.75}
    assert buckets[24] == {"steps": 1, "step_s": 1.0, "forward_s": 0.5}


def test_the_table_shows_the_overhead_over_the_floor_in_ms():
    rows = tail.table({4: {"steps": 3, "step_s": 0.1, "forward_s": 0.09, "floor_s": 0.06}})
    assert rows[2] == "| 4 | 3 | 100.0 | 90.0 | 60.0 | 40.0 | 30.0 | 10.0 | 1.67 |"
