"""rredcot_cli.benchmarks.verify: boxed extraction, math-verify equivalences, and the hard time limit."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rredcot_cli.benchmarks import verify
from rredcot_cli.benchmarks.verify import TIMED_OUT, call_with_timeout, extract_boxed, math_equal

# (gold, completion) pairs that must be accepted.
ACCEPTED = [
    ("\\frac{1}{2}", "so the answer is \\boxed{0.5}"),
    ("0.5", "\\boxed{\\frac{1}{2}}"),
    ("\\frac{1}{2}", "\\boxed{1/2}"),
    ("\\frac12", "\\boxed{\\dfrac{1}{2}}"),
    ("\\frac{1}{3}", "\\boxed{0.333333}"),
    ("\\sqrt{2}/2", "\\boxed{\\frac{\\sqrt{2}}{2}}"),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}"),
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
    ("(3,4]", "\\boxed{(3,4]}"),
    ("(-\\infty, 2) \\cup (3, \\infty)", "\\boxed{(-\\infty,2)\\cup(3,\\infty)}"),
    ("\\{1\\pm\\sqrt{5},-2\\}", "\\boxed{-2, 1+\\sqrt{5}, 1-\\sqrt{5}}"),
    ("1,-2", "\\boxed{-2, 1}"),
    ("\\text{(C)}", "\\boxed{C}"),
    ("10\\%", "\\boxed{10\\%}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "polar: $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$."),
    # GSM8K-style plain numbers, with thousands separators and units
    ("70000", "So he made a profit of \\boxed{70,000} dollars."),
    ("70000", "so he made 70,000 dollars."),
    ("18", "She makes $18 every day."),
    ("18", "\\boxed{\\$18}"),
    ("18", "\\boxed{18.0}"),
    # the LAST boxed answer counts
    ("5", "first \\boxed{4}, then on reflection \\boxed{5}"),
    ("3", "\\boxed{\\boxed{3}}"),
]

# (gold, completion) pairs that must be rejected.
REJECTED = [
    ("\\frac{1}{3}", "\\boxed{0.33}"),
    ("(3,4]", "\\boxed{(3,4)}"),
    ("(3,4]", "\\boxed{[3,4]}"),
    ("70000", "\\boxed{7000}"),
    ("18", "\\boxed{19}"),
    ("18", "I do not know."),
    ("18", ""),
    ("\\text{(C)}", "\\boxed{(D)}"),
    ("\\frac{\\pi}{2}", "\\boxed{\\pi}"),
    ("5", "first \\boxed{5}, then on reflection \\boxed{4}"),
    ("x^2+2x+1", "\\boxed{(x-1)^2}"),
]


@pytest.mark.parametrize("gold,pred", ACCEPTED)
def test_accepted(gold, pred):
    assert math_equal(gold, pred) is True


@pytest.mark.parametrize("gold,pred", REJECTED)
def test_rejected(gold, pred):
    assert math_equal(gold, pred) is False


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("\\boxed{\\frac{a}{\\sqrt{b^{2}}}}", "\\frac{a}{\\sqrt{b^{2}}}"),
        ("a \\boxed{1} b \\boxed{\\{1,2\\}} c", "\\{1,2\\}"),  # escaped braces do not count
        ("\\boxed {42}", "42"),
        ("\\boxed{7} and a truncated \\boxed{12", "7"),  # unclosed last box: the one before
        ("no box here, 42", None),
        ("\\boxed{", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_handles_70_kb_of_unclosed_boxes():
    # A quadratic scan would take minutes here; the test asserts results, never wall time.
    text = "\\boxed{" * 10000 + "1"
    assert extract_boxed(text) is None
    assert extract_boxed(text + "}") == "1"


def _nested_latex(depth: int) -> str:
    return "\\frac{" * depth + "1" + "}{2}" * depth


@pytest.mark.parametrize(
    "completion",
    [
        "Thus \\boxed{" + _nested_latex(5000) + "}",  # 50 kB inside a box
        "Thus $" + _nested_latex(5000) + "$ is the answer",  # 50 kB without a box
        "We have $x^{2}+\\frac{a}{b}$ and " * 1600,  # 50 kB of ordinary LaTeX prose
        "\\boxed{" + "{" * 50000 + "1",  # never-closed box
    ],
)
def test_pathological_completion_is_rejected_or_unscorable(completion):
    # Returning at all is the point: without the deadline these run for minutes. The tests assert
    # results (None = timed out / unscorable, TIMED_OUT), never wall time.
    assert len(completion) >= 50_000
    result = math_equal("5", completion, timeout_s=2.0)
    assert result in (False, None)


def test_hanging_check_times_out_in_main_thread():
    # sympy tries to evaluate 10^(10^10) exactly: without a deadline this runs for minutes.
    assert math_equal("5", "\\boxed{10^{10^{10}}}", timeout_s=1.0) is None
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # timer disarmed
    assert math_equal("5", "\\boxed{5}", timeout_s=1.0) is True  # still usable


def _in_thread(fn, *args):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", fn(*args)))
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    return box["value"]


def test_math_equal_off_main_thread():
    assert _in_thread(math_equal, "\\frac{1}{2}", "\\boxed{0.5}", 5.0) is True
    assert _in_thread(math_equal, "\\frac{1}{2}", "\\boxed{0.6}", 5.0) is False


def test_hanging_check_times_out_off_main_thread():
    _in_thread(math_equal, "1", "\\boxed{1}", 5.0)  # start the helper process outside the timing
    assert _in_thread(math_equal, "5", "\\boxed{10^{10^{10}}}", 1.0) is None
    assert _in_thread(math_equal, "5", "\\boxed{5}", 5.0) is True  # the helper recovered


def test_concurrent_threads():
    results: list = [None] * 6
    pairs = [("\\frac{1}{2}", "\\boxed{0.5}", True), ("3", "\\boxed{4}", False)] * 3

    def work(i):
        gold, pred, _ = pairs[i]
        results[i] = math_equal(gold, pred, 10.0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [expected for _, _, expected in pairs]


def test_helper_killed_when_it_ignores_its_own_alarm():
    # os.system blocks in C until the shell returns, so the helper's SIGALRM cannot interrupt it
    # in time; the caller must kill the helper and still return on time.
    _in_thread(math_equal, "1", "\\boxed{1}", 5.0)
    assert _in_thread(call_with_timeout, os.system, ("sleep 5",), 0.5) is TIMED_OUT
    assert _in_thread(math_equal, "2", "\\boxed{2}", 10.0) is True  # a fresh helper is started


def test_armed_outer_timer_is_left_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert math_equal("\\frac{1}{2}", "\\boxed{0.5}", 10.0) is True  # runs in the helper
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0.0 < remaining <= 30.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not fired


def test_main_thread_deadline_on_plain_function():
    assert call_with_timeout(time.sleep, (10,), 0.3) is TIMED_OUT
    assert call_with_timeout(sum, ([1, 2, 3],), 1.0) == 6


def test_internal_error_is_unscorable(monkeypatch):
    def boom(*args):
        raise RuntimeError("verifier bug")

    monkeypatch.setattr(verify, "_check", boom)
    assert math_equal("1", "\\boxed{1}") is None


def test_helper_error_propagates_and_keeps_helper():
    def attempt():
        try:
            call_with_timeout(int, ("not a number",), 5.0)
        except verify.HelperError as exc:
            return str(exc)
        return "no error"

    assert _in_thread(attempt).startswith("ValueError: invalid literal")
    assert _in_thread(call_with_timeout, int, ("12",), 5.0) == 12
