"""Property-based fuzzing (hypothesis) of the parts that meet arbitrary model output or files:
segmenters, verifiers, artifact and data readers, advantage functions. Each test states its
number of examples; docs/failure-modes.md lists the totals. (More segmenter and RREDCoT
properties: tests/test_segmenters.py, tests/methods/test_rredcot.py.)"""

import dataclasses
import io
import json
import math

import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batches import batch_from_segments
from rredcot_cli.store import artifacts
from rredcot_cli.benchmarks import make_benchmark
from rredcot_cli.benchmarks.base import Problem
from rredcot_cli.errors import ArtifactError, RredcotError
from rredcot_cli.methods import get_method
from rredcot_cli.methods.rredcot import redistribute
from rredcot_cli.config.schema import SegmentConfig
from rredcot_cli.segmenters import SEGMENTERS
from rredcot_cli.benchmarks.verify import extract_boxed, math_equal



def fuzz(examples):
    """Hypothesis settings with an explicit example count (quoted in the docs) and no deadline
    (a shared 2-core CI machine makes per-example timings meaningless)."""
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# Text a model could write: any Unicode (no surrogates: decoders never emit them), biased toward
# the characters parsers care about.
MATHY = st.sampled_from(list("{}\\$^_()[]=+-*/.,0123456789\n ") + ["\\boxed{", "\\frac", "Answer:", "####"])
model_text = st.lists(st.one_of(MATHY, st.text(max_size=5)), max_size=80).map("".join)


# --------------------------------------------------------------------------- segmenters


@fuzz(300)
@given(
    tokens=st.lists(st.text(max_size=12), max_size=200),
    rule=st.sampled_from(sorted(SEGMENTERS)),
    min_tokens=st.integers(0, 10),
    max_segments=st.integers(1, 50),
    entropy=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 10)),
)
def test_segmenters_tile_any_unicode_tokens(tokens, rule, min_tokens, max_segments, entropy):
    kwargs = {k: v for k, v in dataclasses.asdict(SegmentConfig()).items() if k != "name"}
    kwargs.update(min_tokens=min_tokens, max_segments=max_segments)
    spans = SEGMENTERS[rule](tokens, entropies=[entropy] * len(tokens), **kwargs)
    assert spans[0][0] == 0 and spans[-1][1] == len(tokens)
    assert all(e0 == s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))
    assert all(e > s for s, e in spans) if tokens else spans == [(0, 0)]
    assert len(spans) <= max_segments


# --------------------------------------------------------------------------- verifiers


@fuzz(500)
@given(text=model_text)
def test_extract_boxed_returns_a_piece_of_the_text_or_none(text):
    found = extract_boxed(text)
    assert found is None or found in text


CHAIN = make_benchmark("chain", min_steps=2, max_steps=4)
CHAIN_PROBLEM = CHAIN.load("test", limit=1)[0]
GSM8K = make_benchmark("gsm8k", verify_timeout_s=1.0)
MATH500 = make_benchmark("math500", verify_timeout_s=1.0)


@fuzz(500)
@given(text=model_text)
def test_synthetic_verifier_scores_any_completion(text):
    assert CHAIN.verify(text, CHAIN_PROBLEM) in (0.0, 1.0)
    first = CHAIN.first_wrong_step(text, CHAIN_PROBLEM)
    assert first is None or first >= 0
    assert all(0 <= s <= e <= len(text) for s, e in CHAIN.step_char_spans(text))


@fuzz(60)
@given(text=model_text, gold=st.sampled_from(["5", "\\frac{1}{2}", "-3", "(1,2]", "x^2"]))
def test_math_verifier_answers_any_completion_in_time(text, gold):
    # True/False, or None (unscorable: timeout or parser error), never an exception or a hang.
    assert math_equal(gold, text, timeout_s=1.0) in (True, False, None)
    for bench in (GSM8K, MATH500):
        answer = bench.extract_answer(text)
        assert answer is None or isinstance(answer, str)
    # a truncated MATH completion is read the same way, or not at all (a bare token at its end)
    assert MATH500.extract_answer(text, truncated=True) in (None, MATH500.extract_answer(text))


# --------------------------------------------------------------------------- readers


def _valid_samples_bytes():
    row = {
        "prompt_id": "p0", "sample_idx": 0, "prompt": "1+1", "prompt_token_ids": [1, 2], "completion": "=2",
        "completion_token_ids": [3, 4], "completion_logprobs": [-0.1, -0.2], "reward": 1.0, "scorable": True,
        "gold_answer": "2", "pred_answer": "2", "benchmark": "chain", "finish_reason": "stop", "num_tokens": 2,
        "meta": "{}",
    }
    buffer = io.BytesIO()
    pq.write_table(artifacts.build_table("samples", [dict(row, sample_idx=i) for i in range(4)]), buffer)
    return buffer.getvalue()


VALID_SAMPLES = _valid_samples_bytes()


@fuzz(300)
@given(data=st.data(), kind=st.sampled_from(sorted(artifacts.ARTIFACTS)))
def test_artifact_reader_refuses_damaged_files_cleanly(tmp_path_factory, data, kind):
    """Truncated, bit-flipped or arbitrary bytes: the reader returns a valid table or raises
    ArtifactError (one line), never anything else."""
    damage = data.draw(st.sampled_from(["truncate", "flip", "random"]))
    raw = bytearray(VALID_SAMPLES)
    if damage == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif damage == "flip":
        for position in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8)):
            raw[position] ^= data.draw(st.integers(1, 255))
    else:
        raw = bytearray(data.draw(st.binary(max_size=2000)))
    path = tmp_path_factory.mktemp("fuzz") / "artifact.parquet"
    path.write_bytes(bytes(raw))
    try:
        table = artifacts.read_artifact(kind, path)
    except ArtifactError as e:
        assert "\n" not in str(e) and str(path) in str(e)
    else:
        assert table.num_rows >= 0


sample_rows = st.lists(
    st.fixed_dictionaries({
        "prompt_id": st.text(max_size=8), "prompt": st.text(max_size=30), "completion": st.text(max_size=60),
        "tokens": st.lists(st.integers(0, 2**31 - 1), max_size=20), "reward": st.floats(0, 1),
        "scorable": st.booleans(), "pred_answer": st.one_of(st.none(), st.text(max_size=10)),
    }),
    max_size=6,
)


@fuzz(150)
@given(rows=sample_rows)
def test_samples_round_trip_any_text(tmp_path_factory, rows):
    full = [
        {"prompt_id": r["prompt_id"], "sample_idx": i, "prompt": r["prompt"], "prompt_token_ids": [1],
         "completion": r["completion"], "completion_token_ids": r["tokens"],
         "completion_logprobs": [-1.0] * len(r["tokens"]), "reward": r["reward"], "scorable": r["scorable"],
         "gold_answer": "1", "pred_answer": r["pred_answer"], "benchmark": "chain", "finish_reason": "stop",
         "num_tokens": len(r["tokens"]), "meta": json.dumps({"k": r["prompt"]})}
        for i, r in enumerate(rows)
    ]
    path = artifacts.write_artifact("samples", full, tmp_path_factory.mktemp("rt") / "samples.parquet")
    back = artifacts.read_artifact("samples", path).to_pylist()
    assert [r["completion"] for r in back] == [r["completion"] for r in full]
    assert [r["completion_token_ids"] for r in back] == [r["completion_token_ids"] for r in full]


json_lines = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.dictionaries(st.sampled_from(["question", "answer", "x"]),
                        st.one_of(st.text(max_size=20), st.integers(), st.none()), max_size=3)
        .map(lambda d: json.dumps(d).encode()),
        st.just(json.dumps({"question": "q", "answer": "a\n#### 1"}).encode()),
    ),
    max_size=8,
)


@fuzz(300)
@given(lines=json_lines)
def test_benchmark_reader_names_the_bad_line_or_loads(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("jsonl") / "data.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines))
    try:
        problems = make_benchmark("gsm8k", path=str(path)).load("train")
    except RredcotError as e:
        message = str(e)
        assert "\n" not in message and str(path) in message
    else:
        assert all(isinstance(p, Problem) and p.gold_answer for p in problems)


# --------------------------------------------------------------------------- advantages


@st.composite
def credit_batches(draw):
    """Groups of completions with random rewards (incl. unscorable 0s) and segment layouts."""
    groups = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    group_ids, rewards, layouts = [], [], []
    for g, size in enumerate(groups):
        for _ in range(size):
            group_ids.append(g)
            rewards.append(draw(st.sampled_from([0.0, 1.0, 0.5])))
            layouts.append(draw(st.lists(st.integers(1, 6), min_size=1, max_size=5)))
    return batch_from_segments(rewards, group_ids, layouts), layouts


@fuzz(300)
@given(data=credit_batches(), method=st.sampled_from(["grpo", "dr_grpo"]))
def test_outcome_advantages_are_finite_centred_and_zero_on_padding(data, method):
    batch, _ = data
    params = {"scale_by_std": True, "eps": 1e-6} if method == "grpo" else {}
    credit = get_method(method).fn(batch, **params)
    adv = credit.token_advantages
    assert torch.isfinite(adv).all()
    assert torch.all(adv[~batch.token_mask] == 0)
    sequence = adv.max(dim=1).values.where(adv.max(dim=1).values != 0, adv.min(dim=1).values)
    for g in batch.group_ids.unique():
        members = batch.group_ids == g
        if members.sum() > 1:  # a group's advantages sum to zero
            assert sequence[members].sum().item() == pytest.approx(0.0, abs=1e-4)


@fuzz(300)
@given(data=credit_batches(), rule=st.sampled_from(["immediate", "reward_to_go", "mixed"]),
       values=st.data(), clip=st.sampled_from([0.0, 0.5]))
def test_redistribute_is_finite_for_any_values(data, rule, values, clip):
    """Any state values in [0, 1], including constant ones (zero variance) and lone completions."""
    batch, layouts = data
    S = batch.max_segments
    table = torch.full((len(layouts), S + 1), math.nan)
    for i, layout in enumerate(layouts):
        inner = values.draw(st.lists(st.floats(0, 1), min_size=len(layout), max_size=len(layout)))
        table[i, : len(layout)] = torch.tensor(inner)
        table[i, len(layout)] = batch.rewards[i]
    credit = redistribute(table, batch, advantage=rule, mix_lambda=0.5, clip_reward=clip, eps=1e-6)
    assert torch.isfinite(credit.token_advantages).all()
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)
    if clip == 0.0:
        for i, layout in enumerate(layouts):  # segment rewards telescope to R - V(S_0)
            total = torch.nansum(credit.segment_credits[i]).item()
            assert total == pytest.approx(batch.rewards[i].item() - table[i, 0].item(), abs=1e-5)


def test_fuzz_module_counts():
    """The example counts docs/failure-modes.md quotes (keep them in step)."""
    counts = {name: fn._hypothesis_internal_use_settings.max_examples
              for name, fn in globals().items() if name.startswith("test_") and hasattr(fn, "hypothesis")}
    assert counts == {
        "test_segmenters_tile_any_unicode_tokens": 300,
        "test_extract_boxed_returns_a_piece_of_the_text_or_none": 500,
        "test_synthetic_verifier_scores_any_completion": 500,
        "test_math_verifier_answers_any_completion_in_time": 60,
        "test_artifact_reader_refuses_damaged_files_cleanly": 300,
        "test_samples_round_trip_any_text": 150,
        "test_benchmark_reader_names_the_bad_line_or_loads": 300,
        "test_outcome_advantages_are_finite_centred_and_zero_on_padding": 300,
        "test_redistribute_is_finite_for_any_values": 300,
    }
