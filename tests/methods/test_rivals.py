"""ΔBelief-RL and KTAE (issue 16): their formulas on hand-computed tensors, each method on the
embedded tiny model through the path `rredcot attribute` takes, presets, and the CLI (attribute,
judge, and two training steps each)."""

import math
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import torch

from batches import batch_from_segments, run_method
from rredcot_cli.config.compose import compose
from rredcot_cli.methods import get_method
from rredcot_cli.methods.delta_belief import belief_changes, delta_belief_credit, shape_changes, turnwise_grpo
from rredcot_cli.methods.ktae import fisher_exact_p, group_key_tokens, information_gain, key_token_values

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAN = float("nan")
LN2 = math.log(2)
S3 = 1 / math.sqrt(3)  # (2/3) / sqrt(4/3) and friends below


def close(actual, expected, atol=1e-5):
    expected = torch.tensor(expected, dtype=torch.float64)
    actual = actual.to(torch.float64)
    return bool(torch.allclose(actual, expected, atol=atol, equal_nan=True))


# ------------------------------------------------------------------------------------------
# ΔBelief-RL
# ------------------------------------------------------------------------------------------


def test_belief_changes_hand_computed():
    log_b = torch.tensor([[0.1, 0.2, 0.4, 0.9], [0.5, 0.25, 0.9, NAN]]).log()
    K = torch.tensor([3, 2])
    # Row 0: log .2 - log .1 = ln 2, log .4 - log .2 = ln 2; the answer segment gets 0 (outcome).
    assert close(belief_changes(log_b, K, "outcome"), [[LN2, LN2, 0.0], [-LN2, 0.0, NAN]])
    # probe: the final segment's change is read too (log .9 - log .4; log .9 - log .25).
    assert close(belief_changes(log_b, K, "probe"),
                 [[LN2, LN2, math.log(0.9 / 0.4)], [-LN2, math.log(0.9 / 0.25), NAN]])
    with pytest.raises(ValueError, match="final_segment"):
        belief_changes(log_b, K, "last")


def test_shape_changes_hand_computed():
    d = torch.tensor([-3.0, -0.5, 0.0, 0.5, 3.0, NAN])
    assert close(shape_changes(d, "positive"), [0.0, 0.0, 0.0, 0.5, 3.0, NAN])
    assert close(shape_changes(d, "raw"), [-3.0, -0.5, 0.0, 0.5, 3.0, NAN])
    assert close(shape_changes(d, "clip", clip_min=-2.0, clip_max=2.0), [-2.0, -0.5, 0.0, 0.5, 2.0, NAN])
    assert close(shape_changes(d, "tanh", tau=2.0), [math.tanh(-6), math.tanh(-1), 0.0, math.tanh(1), math.tanh(6), NAN])
    with pytest.raises(ValueError, match="shaping"):
        shape_changes(d, "relu")


def test_turnwise_grpo_hand_computed():
    # Group 0: three completions with K = 2, 2, 1; group 1: one completion.
    r = torch.tensor([[2.0, 3.0], [0.0, 1.0], [1.0, NAN], [0.5, NAN]])
    groups, K = torch.tensor([0, 0, 0, 1]), torch.tensor([2, 2, 1, 1])
    zero = turnwise_grpo(r, groups, K, missing_segments="zero", scale_by_std=True, eps=0.0)
    # k = 0: (2, 0, 1), mean 1, unbiased std 1. k = 1 with the missing one as 0: (3, 1, 0), mean 4/3,
    # std sqrt(7/3). The lone completion of group 1: mean 0, std 1.
    s = math.sqrt(7 / 3)
    assert close(zero, [[1.0, (5 / 3) / s], [-1.0, (-1 / 3) / s], [0.0, NAN], [0.5, NAN]])
    skip = turnwise_grpo(r, groups, K, missing_segments="skip", scale_by_std=True, eps=0.0)
    # k = 1 over the two present ones: (3, 1), mean 2, std sqrt 2.
    assert close(skip, [[1.0, 1 / math.sqrt(2)], [-1.0, -1 / math.sqrt(2)], [0.0, NAN], [0.5, NAN]])
    dr = turnwise_grpo(r, groups, K, missing_segments="zero", scale_by_std=False, eps=0.0)
    assert close(dr, [[1.0, 5 / 3], [-1.0, -1 / 3], [0.0, NAN], [0.5, NAN]])
    with pytest.raises(ValueError, match="missing_segments"):
        turnwise_grpo(r, groups, K, missing_segments="drop", scale_by_std=True, eps=0.0)


def _three_completion_batch():
    # Completion 0 (correct): segments of 2, 1, 1 tokens; 1 and 2 (wrong): 1 + 2 and 1 + 1 tokens.
    return batch_from_segments([1.0, 0.0, 0.0], [0, 0, 0], [[2, 1, 1], [1, 2], [1, 1]])


LOG_B = torch.tensor([[0.1, 0.2, 0.4, NAN], [0.5, 0.25, NAN, NAN], [0.2, 0.8, NAN, NAN]]).log()


def test_delta_belief_credit_hand_computed():
    batch = _three_completion_batch()
    # Δ: row 0 (ln 2, ln 2, 0), row 1 (-ln 2, 0), row 2 (ln 4, 0); positive part times lam = 1/ln 2
    # gives (1, 1, 0), (0, 0), (2, 0); plus the outcome R on every segment:
    # r = (2, 2, 1), (0, 0), (2, 0).
    credit = delta_belief_credit(LOG_B, batch, lam=1 / LN2, shaping="positive", clip_min=-2.0, clip_max=2.0, tau=1.0,
                                 final_segment="outcome", missing_segments="zero", segment_penalty=0.0,
                                 scale_by_std=True, eps=0.0)
    # k = 0: (2, 0, 2), mean 4/3, std sqrt(4/3) -> (1, -2, 1)/sqrt 3; k = 1: (2, 0, 0) -> (2, -1, -1)/sqrt 3;
    # k = 2: (1, 0, 0) with the missing ones as 0, mean 1/3, std 1/sqrt 3 -> 2/sqrt 3 for row 0.
    expected = [[S3, 2 * S3, 2 * S3], [-2 * S3, -S3, NAN], [S3, -S3, NAN]]
    assert close(credit.segment_credits, expected)
    assert close(credit.token_advantages, [[S3, S3, 2 * S3, 2 * S3], [-2 * S3, -S3, -S3, 0.0], [S3, -S3, 0.0, 0.0]])
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)
    # Values: the beliefs b_1..b_K-1, then the observed reward on the answer segment.
    assert close(credit.segment_values, [[0.2, 0.4, 1.0], [0.25, 0.0, NAN], [0.8, 0.0, NAN]])
    # segment_penalty -0.5 per segment: outcomes 1 - 1.5, 0 - 1, 0 - 1, so r = (0.5, 0.5, -0.5),
    # (-1, -1), (1, -1). k = 0: mean 1/6, std sqrt(39)/6 -> (2, -7, 5)/sqrt 39; k = 1: mean -1/2,
    # std sqrt(3)/2 -> (2, -1, -1)/sqrt 3; k = 2: (-0.5, 0, 0) with the missing ones as 0: mean -1/6,
    # std 1/sqrt 12 -> -2/sqrt 3 (the zero padding now looks better than the penalised outcome).
    penal = delta_belief_credit(LOG_B, batch, lam=1 / LN2, shaping="positive", clip_min=-2.0, clip_max=2.0, tau=1.0,
                                final_segment="outcome", missing_segments="zero", segment_penalty=-0.5,
                                scale_by_std=True, eps=0.0)
    r39 = math.sqrt(39)
    assert close(penal.segment_credits, [[2 / r39, 2 * S3, -2 * S3], [-7 / r39, -S3, NAN], [5 / r39, -S3, NAN]])


def test_delta_belief_without_belief_term_is_grpo():
    """lam = 0 and equal segment counts: every segment gets the GRPO advantage of its completion."""
    batch = batch_from_segments([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0], [[2, 1], [1, 1], [1, 2], [3, 1]], padding=1)
    log_b = torch.randn(4, 3)
    credit = delta_belief_credit(log_b, batch, lam=0.0, shaping="raw", clip_min=-2.0, clip_max=2.0, tau=1.0,
                                 final_segment="outcome", missing_segments="zero", segment_penalty=0.0,
                                 scale_by_std=True, eps=1e-6)
    grpo = get_method("grpo").fn(batch, scale_by_std=True, eps=1e-6)
    assert torch.allclose(credit.token_advantages, grpo.token_advantages, atol=1e-6)


# ------------------------------------------------------------------------------------------
# KTAE
# ------------------------------------------------------------------------------------------


def test_fisher_exact_p_hand_computed():
    # Margins (4, 4 | 4, 4): P(k) = C(4,k) C(4,4-k) / 70 = (1, 16, 36, 16, 1) / 70.
    tables = torch.tensor([[4, 0, 0, 4], [3, 1, 1, 3], [2, 2, 2, 2], [1, 0, 3, 4], [2, 0, 0, 2]])
    p = fisher_exact_p(tables)
    # (4,0,0,4): the two extreme tables, 2/70; (3,1,1,3): all but k = 2, 34/70; (2,2,2,2): every table;
    # (1,0,3,4): margins (1 | 4, 4), both tables have probability 1/2; (2,0,0,2): 2 / C(4,2).
    assert close(p, [2 / 70, 34 / 70, 1.0, 1.0, 1 / 3], atol=1e-9)


def test_information_gain_hand_computed():
    def h(*counts):
        n = sum(counts)
        return -sum(c / n * math.log2(c / n) for c in counts if c)

    tables = torch.tensor([[4, 0, 0, 4], [2, 2, 2, 2], [1, 0, 3, 4], [0, 0, 4, 4]])
    # (1,0,3,4): H(Y) = 1; present 1 (correct, H 0); absent 7: 3 correct, 4 wrong.
    assert close(information_gain(tables), [1.0, 0.0, 1 - 7 / 8 * h(3, 4), 0.0], atol=1e-9)


KNOBS = dict(alpha=1.0, beta=1.0, top=1.0, k1=2.0, b=0.5, tf_eps=1e-5, rate_eps=1e-10)
# Token ids per completion: two correct ones, then two wrong ones.
GROUP = [[5, 7, 9], [5, 7], [5, 8], [5, 8, 8]]
CORRECT = [True, True, False, False]


def test_key_token_values_hand_computed():
    def kt(score):
        return 2 / (1 + math.exp(-score)) - 1

    # gamma = 0: the direction is Cohen's half-h alone.
    values = group_key_tokens(GROUP, CORRECT, gamma=0.0, **KNOBS)
    # 5 is in every completion: p = 1 -> F = 0, IG = 0 -> KT = 0.
    assert values[5] == pytest.approx(0.0, abs=1e-9)
    # 7 in both correct, no wrong: p = 2/C(4,2) = 1/3, F = exp(-2/3), IG = 1 bit, h = pi/2.
    kt7 = kt((math.exp(-2 / 3) + 1.0) * (math.pi / 2) / 2)
    assert values[7] == pytest.approx(kt7, abs=1e-5)
    # 8 mirrors 7 (both wrong ones, no correct one).
    assert values[8] == pytest.approx(-kt7, abs=1e-5)
    # 9 in one correct completion: p = 1 -> F = 0; IG = 1 - 3/4 H(1/3); h = asin sqrt(1/2) = pi/4.
    ig9 = 1 - 0.75 * (-(1 / 3) * math.log2(1 / 3) - (2 / 3) * math.log2(2 / 3))
    assert values[9] == pytest.approx(kt(ig9 * (math.pi / 4) / 2), abs=1e-5)
    # gamma = 1 adds the term-frequency ratio. Both sets hold 5 tokens, so K = k1 = 2;
    # tf_c(7) = 0.4 * 3 / 2.4 = 0.5 and tf_w(7) = 0: the ratio 0.5 / 1e-5 saturates KT at top = 1.
    with_tf = group_key_tokens(GROUP, CORRECT, gamma=1.0, **KNOBS)
    assert with_tf[7] == pytest.approx(1.0, abs=1e-6) and with_tf[8] == pytest.approx(-1.0, abs=1e-6)
    # 5: tf 0.5 on both sides, ratio term 0, and F = IG = 0 anyway.
    assert with_tf[5] == pytest.approx(0.0, abs=1e-9)
    # A group without an incorrect completion has no key tokens.
    assert group_key_tokens(GROUP[:2], [True, True], gamma=1.0, **KNOBS) == {}
    with pytest.raises(ValueError, match="alpha \\+ beta"):
        key_token_values(torch.zeros(1, 4), torch.zeros(1), torch.zeros(1), 1.0, 1.0, **{**KNOBS, "alpha": 0.0,
                                                                                         "beta": 0.0, "gamma": 0.0})


def test_ktae_adds_key_token_values_to_the_grpo_advantage():
    # Group 0 = GROUP (one segment per token), group 1: two correct completions (uniform).
    rows = GROUP + [[5, 6], [6]]
    seg = [[1] * len(r) for r in rows]
    batch = batch_from_segments([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 0, 1, 1], seg)
    batch.completion_token_ids = rows
    params = {**get_method("ktae").params().__dict__, "gamma": 0.0, "zero_final_token": False}
    credit = get_method("ktae").fn(batch, **params)
    kt = group_key_tokens(GROUP, CORRECT, gamma=0.0, **KNOBS)
    a = 0.5 / math.sqrt(1 / 3)  # GRPO: rewards (1, 1, 0, 0), mean 1/2, unbiased std sqrt(1/3)
    expected = [[a + kt[v] for v in rows[0]], [a + kt[v] for v in rows[1]] + [0.0],
                [-a + kt[v] for v in rows[2]] + [0.0], [-a + kt[v] for v in rows[3]], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert close(credit.token_advantages, expected)
    # One token per segment: segment credit = that token's advantage; no values.
    assert close(credit.segment_credits[0], expected[0]) and torch.isnan(credit.segment_values).all()
    # zero_final_token: the last token of each completion gets the GRPO advantage alone.
    zeroed = get_method("ktae").fn(batch, **{**params, "zero_final_token": True}).token_advantages
    assert zeroed[0, 2].item() == pytest.approx(a, abs=1e-5) and zeroed[3, 2].item() == pytest.approx(-a, abs=1e-5)
    assert zeroed[0, 1].item() == pytest.approx(expected[0][1], abs=1e-5)


# ------------------------------------------------------------------------------------------
# On the embedded tiny model, through credit_batch -> attribute -> credit_rows
# ------------------------------------------------------------------------------------------


def test_delta_belief_on_tiny_model(tiny_chain):
    batch, credit = run_method(tiny_chain, "delta_belief")
    K = batch.num_segments
    values = credit.segment_values
    for i in range(len(K)):
        row = values[i, : int(K[i])]
        assert torch.all((row[:-1] >= 0) & (row[:-1] <= 1))
        assert row[-1].item() == batch.rewards[i].item()  # the answer segment holds the outcome
    assert batch.extras["value_stats"]["forward_tokens"] > 0
    # The wrong completions go wrong at step 2 (segment 1): the trained model's belief in the gold
    # answer falls there, while the gold completions' belief does not.
    raw = run_method(tiny_chain, "delta_belief", shaping="raw", lam=1.0)[1]
    assert raw.segment_credits[1, 1] < raw.segment_credits[0, 1]
    # The same beliefs with the other probe scorer; the verified answer set D contains the gold one.
    kv = run_method(tiny_chain, "delta_belief", probe_scoring="kv_cache")[1]
    assert torch.allclose(kv.segment_values, values, atol=1e-4, equal_nan=True)
    verified = run_method(tiny_chain, "delta_belief", targets="verified")[1]
    inner = ~torch.isnan(values) & (torch.arange(values.shape[1])[None, :] < (K[:, None] - 1))
    assert torch.all(verified.segment_values[inner] >= values[inner] - 1e-6)
    # probe: the answer segment's belief is read from the model too.
    probed = run_method(tiny_chain, "delta_belief", final_segment="probe", agg="mean")[1]
    last = probed.segment_values[torch.arange(len(K)), K - 1]
    assert torch.all((last >= 0) & (last <= 1))


def test_delta_belief_reads_the_answer_probe_values_of_rredcot(tiny_chain):
    """targets=verified probes RREDCoT's answer set D with utility 1: the beliefs are RREDCoT's
    answer_probe values V(S_k) at the inner boundaries."""
    batch, mine = run_method(tiny_chain, "delta_belief", targets="verified")
    _, theirs = run_method(tiny_chain, "rredcot", value="answer_probe")
    inner = torch.arange(mine.segment_values.shape[1])[None, :] < (batch.num_segments[:, None] - 1)
    assert torch.allclose(mine.segment_values[inner], theirs.segment_values[inner], atol=1e-5)


def test_ktae_on_tiny_model(tiny_chain):
    batch, credit = run_method(tiny_chain, "ktae")
    grpo = get_method("grpo").fn(batch, scale_by_std=True, eps=1e-6).token_advantages
    mask = batch.token_mask
    kt = (credit.token_advantages - grpo)[mask]
    # The wrong completions write digits the gold ones never do (the miscomputed results): those
    # tokens carry a key-token value, saturated at -top / +top by the term-frequency ratio (a token
    # absent from one side divides by tf_eps); every other token gets none.
    assert kt.abs().max() <= 1.0 and kt.abs().max() > 0.9
    assert torch.isnan(credit.segment_values).all()
    # Without that term, KT stays strictly inside (-top, top).
    _, soft = run_method(tiny_chain, "ktae", gamma=0.0, top=0.5)
    kt = (soft.token_advantages - grpo)[mask]
    assert 0.01 < kt.abs().max() < 0.5


# ------------------------------------------------------------------------------------------
# Presets and the CLI
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["delta_belief", "ktae"])
def test_presets_compose_to_the_declared_defaults(name):
    cfg = compose([f"method={name}"])
    assert dict(cfg.method) == {"name": name, **get_method(name).params().__dict__}


SMALL = ["benchmark.min_steps=2", "benchmark.max_steps=3", "sampling.n=4", "sampling.max_new_tokens=32"]


def rredcot(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "rredcot_cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"rredcot {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def test_attribute_and_judge_run_both_methods(tmp_path):
    run = tmp_path / "runs" / "rivals"
    rredcot("sample", f"run.dir={run}", *SMALL, "sample.num_prompts=2", cwd=tmp_path)
    rredcot("segment", f"run.dir={run}", *SMALL, cwd=tmp_path)
    for name in ("delta_belief", "ktae"):
        rredcot("attribute", f"run.dir={run}", f"method={name}", *SMALL, cwd=tmp_path)
        credits = pq.read_table(run / f"attribute/{name}/credits.parquet").to_pylist()
        assert credits and {r["method"] for r in credits} == {name}
        assert all(math.isfinite(r["credit"]) for r in credits)
    rredcot("judge", f"run.dir={run}", *SMALL, "judge.methods=[delta_belief,ktae]", "judge.reference_k=2",
            "judge.reruns=1", cwd=tmp_path)
    rows = pq.read_table(run / "judge/credit_quality.parquet").to_pylist()
    assert [r["method"] for r in rows] == ["delta_belief", "ktae", "control:outcome", "control:baseline"]
    assert rows[0]["value_spearman"] is not None and rows[1]["value_spearman"] is None


@pytest.mark.parametrize("name", ["delta_belief", "ktae"])
def test_train_runs_two_steps(tmp_path, name):
    run = tmp_path / "runs" / name
    rredcot("train", f"run.dir={run}", f"method={name}", *SMALL, "train.steps=2", "train.prompts_per_step=2",
            "train.minibatch_size=8", "train.eval_every=0", "train.eval_problems=2", "train.eval_samples=2",
            cwd=tmp_path)
    metrics = pq.read_table(run / "train/metrics.parquet").to_pylist()
    assert [m["step"] for m in metrics] == [1, 2] and all(math.isfinite(m["loss"]) for m in metrics)
