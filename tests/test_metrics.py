"""rredcot_cli.metrics against hand-computed values."""

from __future__ import annotations

import math
from math import comb

import pytest

from rredcot_cli.metrics import accuracy_by_bucket, maj_at_k, mean_ci, pass_at_k, summarize_eval, t_quantile


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2) = 1 - 1/6
    assert pass_at_k(8, 3, 4) == pytest.approx(13 / 14)  # 1 - C(5,4)/C(8,4) = 1 - 5/70
    assert pass_at_k(5, 3, 3) == 1.0  # n - c < k: some correct sample is always drawn


def test_pass_at_k_matches_binomial_formula_and_is_stable():
    for n in range(1, 16):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
    value = pass_at_k(2000, 5, 1000)  # C(2000, 1000) overflows a float
    assert 0.96 < value < 0.97 and math.isfinite(value)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_maj_at_k():
    answers = ["3", "4", "4", "3", "5"]
    correct = [True, False, False, True, False]
    assert maj_at_k(answers, correct, 1) is True  # "3"
    assert maj_at_k(answers, correct, 2) is True  # tie 3/4: "3" appeared first
    assert maj_at_k(answers, correct, 3) is False  # "4" x2
    assert maj_at_k(answers, correct, 4) is True  # tie 2-2, "3" first
    assert maj_at_k(answers, correct, 5) is True


def test_maj_at_k_ignores_none_and_whitespace():
    assert maj_at_k([None, None, "7"], [False, False, True], 3) is True
    assert maj_at_k([None, None], [False, False], 2) is False
    assert maj_at_k(["1 / 2", "1/2", "3"], [True, True, False], 3) is True
    # a copy of the majority answer whose check timed out (None) does not flip it
    assert maj_at_k(["9", "9", "2"], [None, True, False], 3) is True


def _rows():
    # p1: 4 samples, 2 correct; p2: 4 samples, 0 correct, one unscorable.
    return [
        {"prompt_id": "p1", "sample_idx": 0, "correct": True, "pred_answer": "5", "num_tokens": 10, "steps": 4},
        {"prompt_id": "p1", "sample_idx": 1, "correct": False, "pred_answer": "6", "num_tokens": 20, "steps": 4},
        {"prompt_id": "p1", "sample_idx": 2, "correct": True, "pred_answer": "5", "num_tokens": 30, "steps": 4},
        {"prompt_id": "p1", "sample_idx": 3, "correct": False, "pred_answer": "6", "num_tokens": 40, "steps": 4},
        {"prompt_id": "p2", "sample_idx": 3, "correct": None, "pred_answer": None, "num_tokens": 50, "steps": 6},
        {"prompt_id": "p2", "sample_idx": 0, "correct": False, "pred_answer": "1", "num_tokens": 60, "steps": 6},
        {"prompt_id": "p2", "sample_idx": 1, "correct": False, "pred_answer": "2", "num_tokens": 70, "steps": 6},
        {"prompt_id": "p2", "sample_idx": 2, "correct": False, "pred_answer": "2", "num_tokens": 80, "steps": 6},
    ]


def test_summarize_eval_hand_values():
    s = summarize_eval(_rows(), ks=[1, 2, 4, 8])
    assert s["num_problems"] == 2 and s["num_samples"] == 8 and s["n"] == 4
    assert s["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert s["pass@2"] == pytest.approx((5 / 6 + 0.0) / 2)
    assert s["pass@4"] == pytest.approx((1.0 + 0.0) / 2)
    assert "pass@8" not in s and "maj@8" not in s  # k > n is left out
    # p1 votes: maj@1 "5" (right), maj@2 tie -> "5", maj@4 tie 2-2 -> "5"; p2 never right
    assert s["maj@1"] == pytest.approx(0.5)
    assert s["maj@2"] == pytest.approx(0.5)
    assert s["maj@4"] == pytest.approx(0.5)
    assert s["unscorable_frac"] == pytest.approx(1 / 8)
    assert s["mean_tokens"] == pytest.approx(45.0)


def test_unscorable_from_scorable_column():
    rows = [dict(r, correct=bool(r["correct"]), scorable=r["correct"] is not None) for r in _rows()]
    assert summarize_eval(rows, ks=[1])["unscorable_frac"] == pytest.approx(1 / 8)


def test_summarize_eval_uses_sample_order():
    rows = _rows()[:4]
    rows[0], rows[1] = dict(rows[1]), dict(rows[0])  # file order 1,0,...; sample_idx decides
    assert summarize_eval(rows, ks=[1])["maj@1"] == 1.0


def test_summarize_eval_needs_rows():
    with pytest.raises(ValueError):
        summarize_eval([], ks=[1])


def test_accuracy_by_bucket():
    rows = _rows() + [{"prompt_id": "g", "correct": True, "pred_answer": "1", "num_tokens": 5, "steps": None}]
    buckets = accuracy_by_bucket(rows)
    assert list(buckets) == [4, 6]
    assert buckets[4] == {"accuracy": 0.5, "num_samples": 4, "num_problems": 1}
    assert buckets[6] == {"accuracy": 0.0, "num_samples": 4, "num_problems": 1}


def test_t_quantile_known_values():
    assert t_quantile(0.95, 1) == pytest.approx(12.7062047, rel=1e-6)
    assert t_quantile(0.95, 2) == pytest.approx(4.3026527, rel=1e-6)
    assert t_quantile(0.95, 10) == pytest.approx(2.2281389, rel=1e-6)
    assert t_quantile(0.99, 30) == pytest.approx(2.7499957, rel=1e-6)
    assert t_quantile(0.95, 100000) == pytest.approx(1.959985, rel=1e-5)


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 7, 8, 25, 120):
        for conf in (0.5, 0.8, 0.9, 0.95, 0.99):
            assert t_quantile(conf, df) == pytest.approx(stats.t.ppf(0.5 + conf / 2, df), rel=1e-9)


def test_mean_ci():
    mean, low, high = mean_ci([1.0, 2.0, 3.0, 4.0])
    # sd = sqrt(5/3), se = sd / 2, t_{0.975, 3} = 3.1824463
    half = 3.1824463 * math.sqrt(5 / 3) / 2
    assert mean == pytest.approx(2.5)
    assert low == pytest.approx(2.5 - half, rel=1e-6) and high == pytest.approx(2.5 + half, rel=1e-6)
    mean, low, high = mean_ci([0.7])
    assert mean == 0.7 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError):
        mean_ci([])
