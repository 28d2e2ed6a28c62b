"""RREDCoT: redistribution invariants, a hand-computed case, and the packed-probe scorer."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batches import batch_from_segments
from rredcot_cli.methods.rredcot import redistribute, segment_ends
from rredcot_cli.values.packing import Probe, cached_probe_logprobs, packed_probe_logprobs, unpacked_probe_logprobs


def values_tensor(rows, S):
    v = torch.full((len(rows), S + 1), float("nan"))
    for i, row in enumerate(rows):
        v[i, : len(row)] = torch.tensor(row)
    return v


def test_hand_computed_immediate():
    # Two completions of one prompt. Values V0..VK (V0 = group mean 0.5, VK = reward).
    batch = batch_from_segments([1.0, 0.0], [0, 0], [[2, 1, 3], [1, 2]])
    values = values_tensor([[0.5, 0.6, 0.9, 1.0], [0.5, 0.2, 0.0]], 3)
    credit = redistribute(values, batch, advantage="immediate", mix_lambda=1.0, clip_reward=0.0, eps=0.0)
    r = [[0.1, 0.3, 0.1], [-0.3, -0.2]]
    assert torch.allclose(credit.segment_credits[0], torch.tensor(r[0]), atol=1e-6)
    assert torch.allclose(credit.segment_credits[1, :2], torch.tensor(r[1]), atol=1e-6)
    assert torch.isnan(credit.segment_credits[1, 2])
    sigma = torch.tensor([0.1, 0.3, 0.1, -0.3, -0.2]).std().item()
    expected0 = [0.1 / sigma] * 2 + [0.3 / sigma] + [0.1 / sigma] * 3
    assert torch.allclose(credit.token_advantages[0], torch.tensor(expected0), atol=1e-5)
    assert torch.allclose(credit.token_advantages[1, :3], torch.tensor([-0.3, -0.2, -0.2]) / sigma, atol=1e-5)
    assert torch.all(credit.token_advantages[1, 3:] == 0)  # padding gets exactly 0
    assert torch.allclose(credit.segment_values[0], torch.tensor([0.6, 0.9, 1.0]))


def test_hand_computed_reward_to_go_and_mixed():
    batch = batch_from_segments([1.0, 0.0], [0, 0], [[1, 1], [1, 1]])
    values = values_tensor([[0.5, 0.5, 1.0], [0.5, 0.25, 0.0]], 2)
    rtg = redistribute(values, batch, advantage="reward_to_go", mix_lambda=1.0, clip_reward=0.0, eps=0.0)
    r = torch.tensor([0.0, 0.5, -0.25, -0.25])
    norm = (r - r.mean()) / r.std()
    assert torch.allclose(rtg.token_advantages[0], torch.tensor([norm[0] + norm[1], norm[1]]), atol=1e-5)
    mixed = redistribute(values, batch, advantage="mixed", mix_lambda=0.5, clip_reward=0.0, eps=0.0)
    grpo = 0.5 / math.sqrt(0.5)
    assert torch.allclose(mixed.token_advantages[1], torch.tensor([-grpo, -grpo]) + 0.5 * torch.tensor([-0.25, -0.25]) / r.std(), atol=1e-5)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 6), rule=st.sampled_from(["immediate", "reward_to_go", "mixed"]))
def test_telescoping_invariant(data, n, rule):
    seg_lengths = [data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=6)) for _ in range(n)]
    rewards = [float(data.draw(st.integers(0, 1))) for _ in range(n)]
    batch = batch_from_segments(rewards, [0] * n, seg_lengths)
    rows = []
    for i, lengths in enumerate(seg_lengths):
        inner = [data.draw(st.floats(0, 1)) for _ in range(len(lengths) - 1)]
        v0 = data.draw(st.floats(0, 1))
        rows.append([v0, *inner, rewards[i]])
    credit = redistribute(values_tensor(rows, max(len(s) for s in seg_lengths)), batch, advantage=rule,
                          mix_lambda=1.0, clip_reward=0.0, eps=1e-6)
    for i, row in enumerate(rows):
        total = torch.nansum(credit.segment_credits[i]).item()
        assert total == pytest.approx(rewards[i] - row[0], abs=1e-5)
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)
    assert torch.isfinite(credit.token_advantages).all()


def test_segment_ends():
    batch = batch_from_segments([1.0], [0], [[2, 3, 1]])
    assert segment_ends(batch) == [[2, 5, 6]]


@pytest.fixture(scope="module")
def random_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    return Qwen2ForCausalLM(config).eval()


def random_probes(traces, seed=1):
    """Probes after every 7th prefix: random tokens, and some that continue their own trace (the
    KV-cache scorer serves those from the encoding pass)."""
    g = torch.Generator().manual_seed(seed)
    probes = []
    for t, trace in enumerate(traces):
        for prefix in range(1, len(trace) + 1, 7):
            n = int(torch.randint(1, 6, (1,), generator=g))
            tokens = tuple(torch.randint(0, 40, (n,), generator=g).tolist())
            probes.append(Probe(trace=t, prefix_len=prefix, tokens=tokens, scored_from=min(1, n - 1)))
            own = tuple(trace[prefix : prefix + n])
            if own:
                probes.append(Probe(trace=t, prefix_len=prefix, tokens=own, scored_from=0))
    return probes


@pytest.mark.parametrize("scorer", ["packed", "kv_cache"])
def test_probe_scorers_match_scoring_each_prefix_from_scratch(random_model, scorer):
    g = torch.Generator().manual_seed(1)
    traces = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (30, 17, 45)]
    probes = random_probes(traces)
    stats = {}
    if scorer == "packed":
        scored = packed_probe_logprobs(random_model, traces, probes, max_row_tokens=60, rows_per_forward=2, stats=stats)
    else:
        # Small batches so that several trace groups and probe batches are exercised.
        scored = cached_probe_logprobs(random_model, traces, probes, traces_per_forward=2, row_tokens=12, max_probe_tokens=30,
                                       stats=stats)
    reference = unpacked_probe_logprobs(random_model, traces, probes)
    for probe, a, b in zip(probes, scored, reference):
        assert a.shape == b.shape == (len(probe.tokens) - probe.scored_from,)
        assert torch.allclose(a, b, atol=1e-5)
    # The trace is encoded once per row / group, not once per probe.
    naive_tokens = sum(p.prefix_len + len(p.tokens) for p in probes)
    assert stats["forward_tokens"] < naive_tokens


def _score(scorer, model, traces, probes):
    if scorer == "packed":
        return packed_probe_logprobs(model, traces, probes, max_row_tokens=60, rows_per_forward=2)
    return cached_probe_logprobs(model, traces, probes, traces_per_forward=2, row_tokens=12, max_probe_tokens=30)


@pytest.mark.parametrize("scorer", ["packed", "kv_cache"])
def test_probe_scorers_run_the_lm_head_on_scored_positions_only(random_model, scorer, monkeypatch):
    """With a 152k vocabulary, full logits of a probe batch would be tens of GB: the LM head runs on
    the positions a probe scores, in chunks, and a model whose logits are more than the head of the
    last hidden state (soft-capping) falls back to one full pass. Same numbers either way."""
    import rredcot_cli.policy.logprobs as logprobs_module

    g = torch.Generator().manual_seed(2)
    traces = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (30, 17, 45)]
    probes = random_probes(traces, seed=3)
    reference = unpacked_probe_logprobs(random_model, traces, probes)
    scored_positions = sum(len(p.tokens) - p.scored_from for p in probes)
    head_rows = []
    hook = random_model.lm_head.register_forward_hook(lambda m, args, out: head_rows.append(args[0].shape[:-1].numel()))
    try:
        monkeypatch.setattr(logprobs_module, "_HEAD_CHUNK_ELEMENTS", 40 * 5)  # 5 rows per head call
        scored = _score(scorer, random_model, traces, probes)
        assert 0 < sum(head_rows) <= scored_positions
        assert max(head_rows) <= 5
        for a, b in zip(scored, reference):
            assert torch.allclose(a, b, atol=1e-5)
        head_rows.clear()
        monkeypatch.setattr(random_model.config, "final_logit_softcapping", 30.0, raising=False)
        scored = _score(scorer, random_model, traces, probes)
        assert sum(head_rows) > scored_positions  # the full pass: every position of every row
        for a, b in zip(scored, reference):  # Qwen2 ignores the attribute: the same numbers
            assert torch.allclose(a, b, atol=1e-5)
    finally:
        hook.remove()


def test_packed_scorer_batches_rows_of_similar_length(random_model):
    """Issue 42 item 3: a forward pads its rows to the longest, so long and short traces given in
    turn used to share forwards and the short ones ran at the long one's length (2.3x the needed
    positions on real ~1k-token chains). Rows now run longest first: here no forward pads at all."""
    g = torch.Generator().manual_seed(4)
    traces = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (90, 8, 90, 8)]
    probes = [Probe(trace=t, prefix_len=len(trace), tokens=(5, 6, 7), scored_from=1) for t, trace in enumerate(traces)]
    stats = {}
    scored = packed_probe_logprobs(random_model, traces, probes, rows_per_forward=2, stats=stats)
    needed = sum(len(trace) + 3 for trace in traces)
    assert stats["forward_tokens"] == needed  # main ran 2 forwards x 2 rows x 93 = 372, not 208
    for a, b in zip(scored, unpacked_probe_logprobs(random_model, traces, probes)):
        assert torch.allclose(a, b, atol=1e-5)


def test_packed_scorer_runs_a_trace_only_up_to_its_last_probe(random_model):
    """No probe attends past its prefix, so a row stops at its longest probed prefix: the tail of
    the trace (the last segment, 1,000 tokens for a truncated chain cut early) is not run."""
    g = torch.Generator().manual_seed(5)
    traces = [torch.randint(0, 40, (60,), generator=g).tolist()]
    probes = [Probe(trace=0, prefix_len=n, tokens=(3, 4), scored_from=0) for n in (5, 12)]
    stats = {}
    scored = packed_probe_logprobs(random_model, traces, probes, stats=stats)
    assert stats["forward_tokens"] == 12 + 2 + 2  # main ran the whole trace: 60 + 2 + 2
    for a, b in zip(scored, unpacked_probe_logprobs(random_model, traces, probes)):
        assert torch.allclose(a, b, atol=1e-5)


def test_suffix_is_skips_slots_whose_suffixes_share_one_utility():
    """Self-normalised weights sum to one, so a uniform group's values equal its reward without
    scoring anything; a mixed group still needs the model."""
    from rredcot_cli.values.suffix_is import suffix_is_values

    calls = []

    def scorer(model, traces, probes, **kwargs):
        calls.append(len(probes))
        return [torch.zeros(len(p.tokens)) for p in probes]

    traces = [[1, 2, 3, 4, 5], [1, 2, 6, 7, 8], [1, 2, 3, 9, 9]]
    common = dict(prompt_lens=[2, 2, 2], boundaries=[[0, 1], [0, 1], [0, 1]],
                  sampling_logprobs=[[-1.0] * 3] * 3, groups=[0, 0, 0], matched=True, window=0, clip=0.0)
    values = suffix_is_values(None, traces, rewards=[1.0, 1.0, 1.0], self_normalised=True, scorer=scorer, **common)
    assert calls == [] and all(v.tolist() == [1.0, 1.0] for v in values)
    # Mixed rewards: every slot is scored; log w = 0 - (-1 * len) favours longer suffixes equally.
    # Leave-one-out: trace 1's group mates both have reward 1 (its value is 1 without scoring).
    # A mate's suffix cut from the very state of the prefix (the same tokens) has weight exactly 1,
    # unscored: every suffix at slot 0 (the prompt [1, 2]), and at slot 1 trace 2's for trace 0
    # and trace 0's for trace 2 ([1, 2, 3]). Scored: trace 1's suffix for traces 0 and 2 at slot 1.
    values = suffix_is_values(None, traces, rewards=[1.0, 0.0, 1.0], self_normalised=True, scorer=scorer, **common)
    assert calls == [2]
    # Slot 0: equal weights, utilities 0 and 1. Slot 1: the scored suffix has log w = 0 - (-2)
    # (the fake scorer's log-prob 0 against q's -1 per token), the same-state one log w = 0.
    assert values[0].tolist() == pytest.approx([1 / 2, 1 / (1 + math.exp(2))])
    assert values[1].tolist() == [1.0, 1.0]
    # Plain IS weights do not sum to one: the uniform group is scored where states differ (trace
    # 0: trace 1's suffix at slot 1; trace 1: both mates'; trace 2: trace 1's).
    suffix_is_values(None, traces, rewards=[1.0, 1.0, 1.0], self_normalised=False, scorer=scorer, **common)
    assert calls[-1] == 4


def test_suffix_is_window_in_segments_covers_whole_segments():
    """Completions of 10 tokens cut at offsets 0, 3 and 7 (matched slots, one group): a window of
    one segment scores tokens [3, 7) and [7, 10) of each suffix, one of 2 tokens [3, 5), [7, 9);
    two segments reach [3, 10), [7, 10) (at offset 0 both traces are the prompt: weight 1). Hand-computed log weights: the
    scorer gives -1 per token and q -2 per token, so log w = +1 per scored token."""
    from rredcot_cli.values.suffix_is import suffix_is_values

    traces = [[1] + list(range(10, 20)), [1] + list(range(20, 30))]
    common = dict(prompt_lens=[1, 1], boundaries=[[0, 3, 7], [0, 3, 7]], sampling_logprobs=[[-2.0] * 10] * 2,
                  rewards=[1.0, 0.0], groups=[0, 0], matched=True, clip=0.0, self_normalised=False)

    def spans(window, unit):
        seen = []

        def scorer(model, traces_, probes, **kwargs):
            seen.extend((p.trace, p.prefix_len - 1, len(p.tokens)) for p in probes)
            return [torch.full((len(p.tokens),), -1.0) for p in probes]

        values = suffix_is_values(None, traces, window=window, window_unit=unit, scorer=scorer, **common)
        return sorted(set((start, start + n) for _, start, n in seen)), values

    # Slot 0 cuts both traces at the prompt, the same state: weight 1, nothing scored there.
    assert spans(1, "segments")[0] == [(3, 7), (7, 10)]
    assert spans(2, "tokens")[0] == [(3, 5), (7, 9)]
    assert spans(2, "segments")[0] == [(3, 10), (7, 10)]
    # Plain IS, leave-one-out, slot 1: each trace weighs its one mate's suffix (4 tokens, w = e^4).
    # Trace 0's mate has utility 0: V = 0. Trace 1's mate has utility 1: e^4 * 1, capped at the
    # largest utility, 1 (no probability of success exceeds it).
    _, values = spans(1, "segments")
    assert float(values[0][1]) == 0.0
    assert float(values[1][1]) == 1.0
    with pytest.raises(ValueError, match="window unit"):
        suffix_is_values(None, traces, window=1, window_unit="lines", scorer=lambda *a, **k: [], **common)


def test_suffix_is_blames_the_single_wrong_step():
    """Five gold chains and one that miscomputes step 2 and then continues consistently: the
    matched suffix-IS estimator must give step 2's segment the most negative credit."""
    from rredcot_cli.benchmarks.synthetic import ChainBenchmark, apply_op
    from rredcot_cli.methods import get_method
    from rredcot_cli.methods.rredcot import RREDCoTParams
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import load_policy
    from rredcot_cli.pipeline import attribute, credit_batch, segment_rows
    from rredcot_cli.config.schema import SegmentConfig
    from rredcot_cli.policy.logprobs import chunked_completion_logprobs

    policy = load_policy(ModelConfig(chat_template=False), BackendConfig(device="cpu"), seed=0)
    bench = ChainBenchmark(6, 6)
    problem = bench.load("test", 1)[0]
    wrong_at, value, lines = 2, problem.meta["start"], []
    for k, op in enumerate(problem.meta["ops"]):
        result = apply_op(value, op[0], int(op[1:]))
        if k == wrong_at:
            result = (result + 3) % 10
        lines.append(f"{value}{op}={result}")
        value = result
    wrong = "\n".join(lines) + f"\nAnswer: {value}"
    assert bench.first_wrong_step(wrong, problem) == wrong_at

    tok = policy.tokenizer
    prompt = bench.prompt(problem)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]

    def sample(text, idx):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        logprobs, _, _ = chunked_completion_logprobs(policy.model, [prompt_ids], [ids], tok.pad_token_id, 8)
        return {"prompt_id": problem.prompt_id, "sample_idx": idx, "prompt": prompt, "prompt_token_ids": prompt_ids,
                "completion": text, "completion_token_ids": ids, "completion_logprobs": logprobs[0].tolist(),
                "reward": bench.verify(text, problem), "gold_answer": problem.gold_answer,
                "pred_answer": bench.extract_answer(text)}

    samples = [sample(bench.solution(problem), i) for i in range(5)] + [sample(wrong, 5)]
    segments = segment_rows(samples, tok, SegmentConfig(name="newline", tokens=32, min_tokens=1, max_segments=40))
    params = {**RREDCoTParams().__dict__, "value": "suffix_is", "is_self_normalised": False}
    batch = credit_batch(samples, segments, answer_probe=bench.ANSWER_PROBE)
    credit = attribute(get_method("rredcot"), batch, params, {"policy": policy})
    credits = torch.nan_to_num(credit.segment_credits[5], nan=float("inf"))
    assert int(torch.argmin(credits)) == wrong_at  # newline segments: one per step line
    assert credits[wrong_at] < -0.5
    # Telescoping holds on real estimates too: credits sum to R - V(S_0) = 0 - 5/6.
    assert torch.nansum(credit.segment_credits[5]).item() == pytest.approx(-5 / 6, abs=1e-4)


def test_identical_chains_get_exactly_zero_credit():
    """Two copies of one gold chain (a uniform group, as the tiny model often samples): each copy's
    suffixes are cut from the very states of the other's prefixes, so every weight is exactly 1,
    every value 1 and every credit and advantage exactly 0. Scored instead, the sampler's and the
    scorer's float noise (here: log-probs of 0 recorded at sampling) became credits that the
    division by the group's spread of credits turned into advantages of order 1, different under
    data parallelism than in one process."""
    from rredcot_cli.methods import get_method
    from rredcot_cli.methods.rredcot import RREDCoTParams
    from rredcot_cli.pipeline import attribute, credit_batch, segment_rows
    from rredcot_cli.config.schema import SegmentConfig
    from tests.batches import tiny_chain_credit_batch

    policy, samples, _ = tiny_chain_credit_batch()
    twins = [dict(samples[0], sample_idx=0), dict(samples[2], sample_idx=1)]
    assert twins[0]["completion_token_ids"] == twins[1]["completion_token_ids"]
    segments = segment_rows(twins, policy.tokenizer, SegmentConfig(name="newline", tokens=32, min_tokens=1,
                            max_segments=40))
    batch = credit_batch(twins, segments, answer_probe="Answer: {answer}{eos}")
    params = {**RREDCoTParams().__dict__, "value": "suffix_is"}
    credit = attribute(get_method("rredcot"), batch, params, {"policy": policy})
    assert torch.nan_to_num(credit.segment_credits).abs().max().item() == 0.0
    assert credit.token_advantages.abs().max().item() == 0.0


@pytest.fixture
def half_everywhere():
    """A policy-free estimator that knows nothing: V = 0.5 at every prefix asked for."""
    from rredcot_cli.values.registry import _REGISTRY, register_value_estimator

    @register_value_estimator("half_everywhere_for_test")
    def half(batch, policy, offsets, settings):
        return [torch.full((len(offs),), 0.5) for offs in offsets]

    yield "half_everywhere_for_test"
    _REGISTRY.pop("half_everywhere_for_test")


def rredcot_with(estimator, batch):
    from rredcot_cli.methods.rredcot import RREDCoTParams, rredcot
    from dataclasses import asdict

    params = {**asdict(RREDCoTParams()), "value": estimator, "clip_reward": 0.0}
    return rredcot(batch, policy=None, **params)


def test_a_decided_prefix_is_worth_the_verdict_and_the_tail_gets_no_credit(half_everywhere):
    # Completion 0 (R = 1): a step line, the Answer line, two Notes; completion 1 (R = 0): a step
    # line, the Answer line, one Note. decided_values: NaN until the Answer line is complete.
    nan = float("nan")
    batch = batch_from_segments([1.0, 0.0], [0, 0], [[2, 1, 3, 2], [1, 2, 2]])
    batch.extras = {"decided_values": torch.tensor([[nan, 1.0, 1.0, 1.0], [nan, 0.0, 0.0, nan]])}
    credit = rredcot_with(half_everywhere, batch)
    # V0 = group mean 0.5; V1 = the estimate 0.5; V2.. = the verdict; V_K = R.
    assert torch.equal(credit.segment_values[0], torch.tensor([0.5, 1.0, 1.0, 1.0]))
    assert torch.equal(credit.segment_values[1, :3], torch.tensor([0.5, 0.0, 0.0]))
    assert torch.equal(credit.segment_credits[0], torch.tensor([0.0, 0.5, 0.0, 0.0]))
    assert torch.equal(credit.segment_credits[1, :3], torch.tensor([0.0, -0.5, 0.0]))
    tail = batch.segment_ids >= 2
    assert torch.all(credit.token_advantages[tail] == 0)  # the free tail is trained by nothing
    assert credit.segment_value_covered[0].all() and credit.segment_value_covered[1, :3].all()
    # Without decided values the estimate stands and the outcome is released on the last Note.
    batch.extras = {}
    assert torch.equal(rredcot_with(half_everywhere, batch).segment_credits[0], torch.tensor([0.0, 0.0, 0.0, 0.5]))


def chain_tail_rows(texts, rewards):
    """Hand-made samples and newline segments of one chain_tail problem, one token per character."""
    samples, segments = [], []
    for i, (text, reward) in enumerate(zip(texts, rewards)):
        ids = [ord(c) for c in text]
        samples.append({"prompt_id": "chain_tail/test/0", "sample_idx": i, "prompt_token_ids": [1, 2],
                        "completion_token_ids": ids, "completion_logprobs": [0.0] * len(ids), "reward": reward,
                        "gold_answer": "0", "pred_answer": None, "benchmark": "chain_tail"})
        start = 0
        for k, line in enumerate(text.splitlines(keepends=True)):
            segments.append({"prompt_id": "chain_tail/test/0", "sample_idx": i, "segment_idx": k,
                             "token_start": start, "token_end": start + len(line), "text": line})
            start += len(line)
    return samples, segments


def test_credit_batch_grades_each_prefix_from_its_text_never_from_the_reward(half_everywhere):
    from rredcot_cli.benchmarks.synthetic import ChainBenchmark, ChainTailBenchmark
    from rredcot_cli.pipeline import credit_batch

    texts = ["7+3=0\nAnswer: 0\nNote: sun 3 cat dog\nNote: red 1 red red", "7+3=1\nAnswer: 1\nNote: sun 3 cat dog"]
    samples, segments = chain_tail_rows(texts, [1.0, 0.0])
    nan = float("nan")
    batch = credit_batch(samples, segments, benchmark=ChainTailBenchmark())
    expected = torch.tensor([[nan, 1.0, 1.0, 1.0], [nan, 0.0, 0.0, nan]])
    assert torch.equal(batch.extras["decided_values"].isnan(), expected.isnan())
    assert torch.equal(batch.extras["decided_values"].nan_to_num(-1), expected.nan_to_num(-1))
    credit = rredcot_with(half_everywhere, batch)
    assert torch.equal(credit.segment_credits[0], torch.tensor([0.0, 0.5, 0.0, 0.0]))
    # Flip the rewards (a trace's own reward must move none of its inner values): only V_K moves.
    flipped = credit_batch([{**s, "reward": 1.0 - s["reward"]} for s in samples], segments,
                           benchmark=ChainTailBenchmark())
    moved = rredcot_with(half_everywhere, flipped)
    assert torch.equal(moved.segment_values[0, :3], credit.segment_values[0, :3])
    assert torch.equal(moved.segment_values[1, :2], credit.segment_values[1, :2])
    # Without the benchmark (or rows of another benchmark) nothing is decided.
    assert credit_batch(samples, segments).extras["decided_values"] is None
    other = [{**s, "benchmark": "chain"} for s in samples]
    assert credit_batch(other, segments, benchmark=ChainTailBenchmark()).extras["decided_values"].isnan().all()
    assert credit_batch(samples, segments, benchmark=ChainBenchmark()).extras["decided_values"].isnan().all()
