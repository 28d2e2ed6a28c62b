"""Model-based peer methods: mc (Monte Carlo values), loo (leave-one-segment-out) and gradient
(gradient x input / integrated gradients). Hand-computed formulas first, then the embedded tiny
model through the path ``rredcot attribute`` takes (credit_batch -> attribute)."""

import math

import pytest
import torch

from batches import batch_from_segments


# ------------------------------------------------------------------ mc: hand-computed tensors


def test_vineppo_advantages_hand_computed():
    from rredcot_cli.methods.mc import assemble_values, vineppo_credit

    batch = batch_from_segments([1.0, 0.0], [0, 0], [[2, 1, 2], [1, 2]], padding=1)
    # MC estimates at S_0..S_{K-1}; V(S_K) is the reward.
    values = assemble_values([torch.tensor([0.5, 0.25, 0.75]), torch.tensor([0.5, 0.125])], batch.rewards,
                             batch.num_segments)
    assert torch.equal(values[0], torch.tensor([0.5, 0.25, 0.75, 1.0]))
    assert values[1, 2] == 0.0 and torch.isnan(values[1, 3])
    credit = vineppo_credit(values, batch)
    assert torch.allclose(credit.segment_credits[0], torch.tensor([-0.25, 0.5, 0.25]))
    assert torch.allclose(credit.segment_credits[1, :2], torch.tensor([-0.375, -0.125]))
    assert torch.isnan(credit.segment_credits[1, 2])
    assert torch.allclose(credit.token_advantages[0], torch.tensor([-0.25, -0.25, 0.5, 0.25, 0.25, 0.0]))
    assert torch.allclose(credit.token_advantages[1], torch.tensor([-0.375, -0.125, -0.125, 0.0, 0.0, 0.0]))
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)  # padding exactly 0
    assert torch.allclose(credit.segment_values[0], torch.tensor([0.25, 0.75, 1.0]))
    # Credits telescope to R - V(S_0).
    assert torch.nansum(credit.segment_credits[0]).item() == pytest.approx(0.5)
    # Clipping acts on the advantage only; credits stay the raw differences.
    clipped = vineppo_credit(values, batch, clip_reward=0.3)
    assert torch.allclose(clipped.token_advantages[0, :3], torch.tensor([-0.25, -0.25, 0.3]))
    assert torch.allclose(clipped.segment_credits[0], credit.segment_credits[0])


def test_assemble_values_with_group_mean_baseline():
    from rredcot_cli.methods.mc import assemble_values

    batch = batch_from_segments([1.0, 0.0], [0, 0], [[1, 1], [1]], padding=1)
    values = assemble_values([torch.tensor([0.75]), torch.tensor([])], batch.rewards, batch.num_segments,
                             v0=torch.tensor([0.5, 0.5]))
    assert torch.equal(values[0], torch.tensor([0.5, 0.75, 1.0]))
    assert values[1, 0] == 0.5 and values[1, 1] == 0.0 and torch.isnan(values[1, 2])


def test_top_p_warp_hand_computed():
    from rredcot_cli.policy.continuations import warp_logits

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.allclose(warp_logits(logits, 1.0, 0.6).exp(), torch.tensor([[0.625, 0.375, 0.0]]))
    # The first token alone already reaches 0.45: only it is kept.
    assert torch.allclose(warp_logits(logits, 1.0, 0.45).exp(), torch.tensor([[1.0, 0.0, 0.0]]))
    hot = warp_logits(logits, 2.0, 1.0).exp()
    expected = torch.tensor([0.5, 0.3, 0.2]) ** 0.5
    assert torch.allclose(hot[0], expected / expected.sum())


# ------------------------------------------------- loo / gradient: hand-computed tensors


def test_combine_candidates_and_their_weights():
    from rredcot_cli.methods._attribution import candidate_weights, combine_candidates

    lp = torch.log(torch.tensor([0.2, 0.1, 0.3]))
    u = torch.tensor([1.0, 0.5, 0.0])  # the third is a padding candidate (utility 0)
    assert combine_candidates(lp, u, "value").item() == pytest.approx(0.25)
    assert combine_candidates(lp, u, "logprob").item() == pytest.approx(math.log(0.25))
    assert torch.allclose(candidate_weights(lp, u, "value"), torch.tensor([0.2, 0.05, 0.0]))
    assert torch.allclose(candidate_weights(lp, u, "logprob"), torch.tensor([0.8, 0.2, 0.0]))


def test_loo_attributions_hand_computed():
    from rredcot_cli.methods.loo import loo_attributions

    full = torch.tensor([-1.0, -2.0])
    dropped = torch.tensor([[-3.0, -0.5, float("nan")], [-2.5, float("nan"), float("nan")]])
    a = loo_attributions(full, dropped, torch.tensor([3, 2]))
    assert torch.allclose(a[0], torch.tensor([2.0, -0.5, 0.0]))  # unscored (answer) segment -> 0
    assert a[1, 0] == pytest.approx(0.5) and a[1, 1] == 0.0 and torch.isnan(a[1, 2])


def test_segment_sums_hand_computed():
    from rredcot_cli.methods._attribution import segment_sums

    batch = batch_from_segments([1.0, 0.0], [0, 0], [[2, 1], [1]], padding=1)
    values = torch.tensor([[1.0, 2.0, 4.0, 100.0], [8.0, 100.0, 100.0, 100.0]])  # 100 sits on padding
    sums = segment_sums(values, batch.segment_ids, batch.num_segments)
    assert torch.equal(sums[0], torch.tensor([3.0, 4.0]))
    assert sums[1, 0] == 8.0 and torch.isnan(sums[1, 1])


def test_attribution_advantages_hand_computed():
    from rredcot_cli.methods._attribution import attribution_advantages

    batch = batch_from_segments([1.0, 0.0], [0, 0], [[2, 1], [1, 1]], padding=1)
    attributions = torch.tensor([[2.0, 0.0], [1.0, -1.0]])
    credit = attribution_advantages(attributions, batch, beta=1.0, w_min=0.1, w_max=3.0, eps=0.0)
    # GRPO: mean 0.5, unbiased std sqrt(0.5) -> A = +-sqrt(0.5).
    A = math.sqrt(0.5)
    # rho = sign(A) * a = [2, 0 | -1, 1]; group mean 0.5, unbiased std sqrt(5/3).
    sd = math.sqrt(5 / 3)
    z = [(2 - 0.5) / sd, (0 - 0.5) / sd, (-1 - 0.5) / sd, (1 - 0.5) / sd]
    w = [min(max(1 + zi, 0.1), 3.0) for zi in z]
    assert w[2] == 0.1  # clipped at w_min
    row0 = [w[0], w[0], w[1]]
    row0 = [x * 3 / sum(row0) for x in row0]
    row1 = [w[2], w[3]]
    row1 = [x * 2 / sum(row1) for x in row1]
    assert torch.allclose(credit.token_advantages[0, :3], torch.tensor([A * x for x in row0]), atol=1e-5)
    assert torch.allclose(credit.token_advantages[1, :2], torch.tensor([-A * x for x in row1]), atol=1e-5)
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)  # padding exactly 0
    # Budget: each completion keeps GRPO's total advantage T_i * A_i.
    assert credit.token_advantages[0].sum().item() == pytest.approx(3 * A, abs=1e-5)
    assert credit.token_advantages[1].sum().item() == pytest.approx(-2 * A, abs=1e-5)
    assert torch.equal(credit.segment_credits, attributions)
    assert torch.isnan(credit.segment_values).all()


def test_attribution_advantages_vanish_on_uniform_groups():
    from rredcot_cli.methods._attribution import attribution_advantages

    batch = batch_from_segments([1.0, 1.0], [0, 0], [[1, 2], [3]], padding=1)
    credit = attribution_advantages(torch.tensor([[5.0, -1.0], [2.0, float("nan")]]), batch, beta=1.0,
                                    w_min=0.1, w_max=3.0, eps=1e-6)
    assert torch.all(credit.token_advantages == 0)


def test_combine_token_attributions_hand_computed():
    from rredcot_cli.methods.gradient import combine_token_attributions, ig_alphas

    assert ig_alphas(0) == [1.0] and ig_alphas(4) == [0.125, 0.375, 0.625, 0.875]
    # Two alphas x two candidates x two tokens.
    lp = torch.log(torch.tensor([[0.3, 0.1], [0.2, 0.2]]))
    products = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[-1.0, 0.0], [1.0, 1.0]]])
    u = torch.tensor([1.0, 1.0])
    # logprob score: weights softmax(lp) = [0.75, 0.25] then [0.5, 0.5].
    first = 0.75 * torch.tensor([1.0, 2.0]) + 0.25 * torch.tensor([3.0, 4.0])
    second = 0.5 * torch.tensor([-1.0, 0.0]) + 0.5 * torch.tensor([1.0, 1.0])
    got = combine_token_attributions(lp, products, u, "logprob")
    assert torch.allclose(got, (first + second) / 2)
    # value score: weights U exp(lp).
    first = 0.3 * torch.tensor([1.0, 2.0]) + 0.1 * torch.tensor([3.0, 4.0])
    second = 0.2 * torch.tensor([-1.0, 0.0]) + 0.2 * torch.tensor([1.0, 1.0])
    assert torch.allclose(combine_token_attributions(lp, products, u, "value"), (first + second) / 2)


# ------------------------------------------------------------------- the embedded tiny model


@pytest.fixture(scope="module")
def policy():
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import load_policy

    return load_policy(ModelConfig(chat_template=False), BackendConfig(device="cpu"), seed=0)


@pytest.fixture(scope="module")
def traces(policy):
    """2 prompts x 2 sampled completions of short chains, newline-segmented, as the stages make them."""
    from rredcot_cli.benchmarks.synthetic import ChainBenchmark
    from rredcot_cli.pipeline import sample_rows, segment_rows
    from rredcot_cli.config.schema import SegmentConfig

    bench = ChainBenchmark(2, 3)
    problems = bench.load("train", 2)
    samples = sample_rows(policy, bench, problems, n=2, max_new_tokens=40, temperature=1.0, top_p=1.0, seed=3,
                          prompts_per_call=2)
    segments = segment_rows(samples, policy.tokenizer, SegmentConfig(name="newline", tokens=32,
                            min_tokens=1, max_segments=40))
    return bench, problems, samples, segments


def run_method(name, traces, policy, **params):
    from rredcot_cli.methods import get_method
    from rredcot_cli.pipeline import attribute, credit_batch, credit_rows

    bench, _, samples, segments = traces
    spec = get_method(name)
    batch = credit_batch(samples, segments, answer_probe=bench.ANSWER_PROBE)
    credit = attribute(spec, batch, {**spec.params().__dict__, **params}, {"scorer": policy.backend, "policy": policy})
    B, T = batch.segment_ids.shape
    assert credit.token_advantages.shape == (B, T) and credit.token_advantages.dtype == torch.float32
    assert torch.isfinite(credit.token_advantages).all()
    assert torch.all(credit.token_advantages[~batch.token_mask] == 0)
    assert credit.segment_credits.shape == (B, batch.max_segments)
    exists = torch.arange(batch.max_segments)[None, :] < batch.num_segments[:, None]
    assert torch.isfinite(credit.segment_credits[exists]).all() and torch.isnan(credit.segment_credits[~exists]).all()
    credits, advantages = credit_rows(samples, batch, credit, name)  # what the stage writes
    assert len(credits) == int(batch.num_segments.sum()) and len(advantages) == B
    return batch, credit


def test_continuations_greedy_match_generate_and_do_not_depend_on_batching(policy):
    from rredcot_cli.policy.continuations import sample_continuations

    tok = policy.tokenizer
    prefixes = [tok("Compute mod 10: 3 +4 *2\n", add_special_tokens=False)["input_ids"],
                tok("Compute mod 10: 7 -1\n7-1=6\n", add_special_tokens=False)["input_ids"]]
    kwargs = dict(max_new_tokens=30, top_p=1.0, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, seed=0)
    greedy = sample_continuations(policy.model, prefixes, k=2, temperature=0.0, **kwargs)
    for prefix, conts in zip(prefixes, greedy):
        ref = policy.model.generate(input_ids=torch.tensor([prefix]), max_new_tokens=30, do_sample=False,
                                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        assert conts[0] == conts[1] == ref[0, len(prefix) :].tolist()
    stats = {}
    sampled = sample_continuations(policy.model, prefixes, k=3, temperature=1.0, stats=stats, **kwargs)
    alone = [sample_continuations(policy.model, [p], k=3, temperature=1.0, rows_per_forward=1, **kwargs)[0]
             for p in prefixes]
    assert sampled == alone  # per-prefix noise: the batch a prefix sits in does not matter
    assert stats["continuations"] == 6 and stats["generated_tokens"] == sum(len(c) for cs in sampled for c in cs)
    other_seed = sample_continuations(policy.model, prefixes, k=3, temperature=1.0, **{**kwargs, "seed": 1})
    assert other_seed != sampled


def test_continuations_same_with_transformers_cache(policy, monkeypatch):
    """kvcache.growing_cache and the lazy dropping of finished rows change the cost, not the
    samples: transformers' concatenating cache gives the same continuations."""
    from transformers import DynamicCache

    import rredcot_cli.policy.continuations as mc

    tok = policy.tokenizer
    prefixes = [tok("Compute mod 10: 3 +4 *2\n", add_special_tokens=False)["input_ids"],
                tok("Compute mod 10: 7 -1 +9 *3 -2\n7-1=6\n", add_special_tokens=False)["input_ids"],
                tok("Compute mod 10: 5\n", add_special_tokens=False)["input_ids"]]
    kwargs = dict(k=4, max_new_tokens=40, temperature=1.0, top_p=0.9, eos_ids=[tok.eos_token_id],
                  pad_id=tok.pad_token_id, seed=3)
    growing = mc.sample_continuations(policy.model, prefixes, **kwargs)
    monkeypatch.setattr(mc, "_empty_cache", lambda model, max_length: DynamicCache())
    assert mc.sample_continuations(policy.model, prefixes, **kwargs) == growing
    assert len({len(c) for cs in growing for c in cs}) > 1  # rows finished at different steps


def test_continuations_keep_each_prefix_budget_and_mc_gives_what_is_left(policy):
    """Per-prefix budgets cap each prefix's continuations without changing another prefix's; mc
    continues a completion prefix of o tokens with max_new_tokens - o, so no completion it scores
    is longer than the sampler's budget."""
    import functools

    from rredcot_cli.policy.continuations import sample_continuations
    from rredcot_cli.values.mc import mc_rewards

    tok = policy.tokenizer
    prefixes = [tok("Compute mod 10: 3 +4 *2 -1 +5\n", add_special_tokens=False)["input_ids"],
                tok("Compute mod 10: 7 -1 +9 *3 -2\n7-1=6\n", add_special_tokens=False)["input_ids"]]
    kwargs = dict(k=4, temperature=1.0, top_p=1.0, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, seed=5)
    capped = sample_continuations(policy.model, prefixes, max_new_tokens=[3, 40], **kwargs)
    assert all(len(c) <= 3 for c in capped[0]) and any(len(c) == 3 for c in capped[0])
    assert capped[1] == sample_continuations(policy.model, prefixes[1:], max_new_tokens=40, **kwargs)[0]
    with pytest.raises(ValueError, match="one budget"):
        sample_continuations(policy.model, prefixes, max_new_tokens=[3], **kwargs)

    completion = tok("3+4=7\n7*2=4\n4-1=3\n", add_special_tokens=False)["input_ids"]
    scored = []
    continue_prefixes = functools.partial(sample_continuations, policy.model, **kwargs)
    mc_rewards(continue_prefixes, [prefixes[0]], [completion], [[0, 6, 12]],
               lambda i, ids, reason: scored.append((len(ids), reason, ids[-1])) or 0.0, k=4, max_new_tokens=20,
               eos_ids=kwargs["eos_ids"])
    assert len(scored) == 12 and max(n for n, _, _ in scored) <= 20
    # A continuation is "stop" exactly when it ended with the EOS, else it was cut at its budget
    # ("length") and is graded as a truncated sample is.
    assert all((reason == "stop") == (last == tok.eos_token_id) for _, reason, last in scored)
    assert all(n == 20 for n, reason, _ in scored if reason == "length")


def test_mc_grades_a_cut_continuation_as_a_truncated_sample():
    """On GSM8K a continuation cut at its budget gets no last-number fallback: the rule samples
    follow (benchmarks.base.grade_completion); before, mc scored it as finished."""
    from rredcot_cli.methods.base import CreditBatch
    from rredcot_cli.methods.mc import batch_verifier
    from rredcot_cli.policy.models import build_char_tokenizer

    tok = build_char_tokenizer()
    batch = CreditBatch.__new__(CreditBatch)
    batch.extras = {"benchmarks": ["gsm8k"], "gold_answers": ["12"], "prompt_ids": ["gsm8k/test/0"]}
    verify = batch_verifier(batch, tok)
    ids = tok("Checking: 7 + 5 = 12 and", add_special_tokens=False)["input_ids"]
    assert verify(0, ids, "stop") == 1.0
    assert verify(0, ids, "length") == 0.0


def test_mc_greedy_values_are_the_verified_greedy_continuation(traces, policy):
    """Temperature 0: every continuation is the greedy one, so V(S_k) in {0, 1} is exactly the
    verifier's verdict on prefix + greedy continuation, and V(S_K) is the reward."""
    from rredcot_cli.methods.rredcot import segment_ends

    bench, problems, samples, _ = traces
    batch, credit = run_method("mc", traces, policy, k=2, max_new_tokens=40, temperature=0.0)
    values = torch.cat([torch.full((batch.rewards.shape[0], 1), float("nan")), credit.segment_values], 1)
    tok = policy.tokenizer
    by_id = {p.prompt_id: p for p in problems}
    for i, ends in enumerate(segment_ends(batch)):
        K = int(batch.num_segments[i])
        assert values[i, K] == batch.rewards[i]
        for k in range(1, K):
            v = values[i, k].item()
            assert v in (0.0, 1.0)
            prefix = samples[i]["prompt_token_ids"] + samples[i]["completion_token_ids"][: ends[k - 1]]
            out = policy.model.generate(input_ids=torch.tensor([prefix]), max_new_tokens=40, do_sample=False,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            text = tok.decode(out[0, len(samples[i]["prompt_token_ids"]) :], skip_special_tokens=True)
            assert v == bench.verify(text, by_id[samples[i]["prompt_id"]])


def test_mc_sampled_values_in_unit_interval_and_seeded(traces, policy):
    from rredcot_cli.methods.mc import mc_reference_values

    batch, credit = run_method("mc", traces, policy, k=2, max_new_tokens=40, temperature=1.0, seed=5)
    S = batch.max_segments
    exists = torch.arange(S)[None, :] < batch.num_segments[:, None]
    v = credit.segment_values[exists]
    assert ((v >= 0) & (v <= 1)).all()
    assert torch.all((v * 2) == (v * 2).round())  # means of K=2 verdicts
    last = credit.segment_values.gather(1, (batch.num_segments - 1)[:, None])[:, 0]
    assert torch.equal(last, batch.rewards)
    assert batch.extras["value_stats"]["generated_tokens"] > 0
    # The reference function gives the same values (same seed) and V(S_0) from the prompt.
    reference = mc_reference_values(batch, policy, k=2, max_new_tokens=40, temperature=1.0, seed=5)
    assert torch.allclose(reference[:, 1:][exists], credit.segment_values[exists])
    assert ((reference[:, 0] >= 0) & (reference[:, 0] <= 1)).all()
    # Completions of one prompt share V(S_0) (one estimate per prompt).
    for g in batch.group_ids.unique():
        assert reference[batch.group_ids == g, 0].unique().numel() == 1
    _, again = run_method("mc", traces, policy, k=2, max_new_tokens=40, temperature=1.0, seed=5)
    assert torch.equal(again.token_advantages, credit.token_advantages)


def test_loo_packed_scores_equal_scoring_the_shortened_text(traces, policy):
    """Each dropped-segment score must equal the forced answer scored after the text with that
    segment really deleted (run from scratch)."""
    from rredcot_cli.policy.logprobs import completion_logprobs
    from rredcot_cli.methods._attribution import reasoning_ends, segment_spans
    from rredcot_cli.methods.loo import loo_scores
    from rredcot_cli.methods.rredcot import answer_candidates
    from rredcot_cli.pipeline import credit_batch

    bench, _, samples, segments = traces
    batch = credit_batch(samples, segments, answer_probe=bench.ANSWER_PROBE)
    tok = policy.tokenizer
    spans, ends = segment_spans(batch), reasoning_ends(batch, [tok.eos_token_id], "last")
    candidates = answer_candidates(batch, tok, bench.ANSWER_PROBE)
    full, dropped = loo_scores(policy.model, batch.prompt_token_ids, batch.completion_token_ids, spans, ends,
                               candidates, score="logprob")

    def score(context, cands):
        lps = []
        for cand in cands:
            lp, _, _ = completion_logprobs(policy.model, [list(context) + list(cand.context)], [list(cand.answer)],
                                           tok.pad_token_id, with_entropy=False)
            lps.append(lp.sum().item())
        return math.log(sum(cand.utility * math.exp(x) for cand, x in zip(cands, lps)))

    checked = 0
    with torch.no_grad():
        for i in range(len(samples)):
            prompt, completion = batch.prompt_token_ids[i], batch.completion_token_ids[i]
            assert full[i].item() == pytest.approx(score(prompt + completion[: ends[i]], candidates[i]), abs=1e-4)
            for k, (start, stop) in enumerate(spans[i]):
                if start >= ends[i]:
                    assert torch.isnan(dropped[i, k])
                    continue
                shortened = prompt + completion[:start] + completion[stop : ends[i]]
                assert dropped[i, k].item() == pytest.approx(score(shortened, candidates[i]), abs=1e-4)
                checked += 1
    assert checked >= 2


def test_loo_runs_through_attribute(traces, policy):
    batch, credit = run_method("loo", traces, policy)
    last = credit.segment_credits.gather(1, (batch.num_segments - 1)[:, None])[:, 0]
    assert torch.all(last == 0)  # the answer segment is never in the context
    _, value_credit = run_method("loo", traces, policy, score="value", answer_segment="none")
    exists = torch.arange(batch.max_segments)[None, :] < batch.num_segments[:, None]
    assert (value_credit.segment_credits[exists].abs() <= 1).all()  # differences of probabilities


@pytest.fixture(scope="module")
def double_model(policy):
    import copy

    return copy.deepcopy(policy.model).double().eval()


def grad_row(traces, policy, i):
    """The gradient method's row for completion i and its first answer candidate."""
    from rredcot_cli.methods._attribution import reasoning_ends, segment_spans
    from rredcot_cli.methods.gradient import GradRow
    from rredcot_cli.methods.rredcot import answer_candidates
    from rredcot_cli.pipeline import credit_batch

    bench, _, samples, segments = traces
    batch = credit_batch(samples, segments, answer_probe=bench.ANSWER_PROBE)
    tok = policy.tokenizer
    end = reasoning_ends(batch, [tok.eos_token_id], "last")[i]
    cand = answer_candidates(batch, tok, bench.ANSWER_PROBE)[i][0]
    prompt = batch.prompt_token_ids[i]
    context = tuple(prompt) + tuple(batch.completion_token_ids[i][:end])
    row = GradRow(ids=context + cand.context + cand.answer, attr_start=len(prompt), attr_end=len(context),
                  answer_from=len(context) + len(cand.context), alpha=1.0)
    return row, [(s, min(e, end)) for s, e in segment_spans(batch)[i] if s < end]


def test_gradient_x_input_matches_finite_differences(traces, policy, double_model):
    """Sum over a segment of e_t . d lp / d x_t is the derivative of lp along scaling that
    segment's embeddings by (1 + h): compare with a central difference. The model runs in float64
    but Llama's RMSNorm computes in float32, so h is not tiny (measured: h=1e-2 agrees to <0.5%,
    h=1e-4 is float32 noise)."""
    from rredcot_cli.methods.gradient import embedding_grad_products

    h = 1e-2
    for i in range(len(traces[2])):
        row, spans = grad_row(traces, policy, i)
        _, products = embedding_grad_products(double_model, [row])
        n = row.attr_end - row.attr_start
        for start, stop in spans:
            up, down = torch.ones(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
            up[start:stop] += h
            down[start:stop] -= h
            lp_up, _ = embedding_grad_products(double_model, [row], scales=[up])
            lp_down, _ = embedding_grad_products(double_model, [row], scales=[down])
            fd = (lp_up - lp_down).item() / (2 * h)
            assert products[0][start:stop].sum().item() == pytest.approx(fd, rel=1e-2, abs=1e-5)


def test_gradient_rows_batched_score_as_alone_and_skip_the_contexts_logits(traces, policy, double_model):
    """Left-padded rows of different lengths give each row's numbers alone; the LM head runs from
    the earliest answer's first prediction on, not over the contexts (a 152k vocabulary makes
    those logits and their gradients the largest tensors of the pass)."""
    from rredcot_cli.methods.gradient import embedding_grad_products

    rows = [grad_row(traces, policy, i)[0] for i in range(len(traces[2]))]
    assert len({len(r.ids) - r.answer_from for r in rows} | {len(r.ids) for r in rows}) > 1
    head_positions = []
    hook = double_model.lm_head.register_forward_hook(lambda m, args, out: head_positions.append(args[0].shape[1]))
    try:
        lp_all, products_all = embedding_grad_products(double_model, rows)
    finally:
        hook.remove()
    width = max(len(r.ids) for r in rows)
    assert head_positions == [max(len(r.ids) - r.answer_from for r in rows) + 1] and head_positions[0] < width
    for r, row in enumerate(rows):
        lp, products = embedding_grad_products(double_model, [row])
        assert lp_all[r].item() == pytest.approx(lp[0].item(), rel=1e-5, abs=1e-6)
        assert torch.allclose(products_all[r], products[0], rtol=1e-4, atol=1e-6)


class SmoothToyLM(torch.nn.Module):
    """A hand-built causal LM, smooth along IG's path: logits_t = W tanh(sum_{u<=t} x_u)."""

    def __init__(self, vocab=7, hidden=5):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, hidden).double()
        self.out = torch.nn.Linear(hidden, vocab).double()

    def get_input_embeddings(self):
        return self.embed

    def forward(self, inputs_embeds, attention_mask, position_ids, use_cache):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.out(torch.tanh(inputs_embeds.cumsum(1))))


def test_integrated_gradients_complete_on_a_smooth_model():
    """IG completeness: attributions sum to lp(input) - lp(zero completion embeddings), up to the
    midpoint rule's O(1/m^2) error; gradient x input does not satisfy it on a nonlinear model."""
    from dataclasses import replace

    from rredcot_cli.methods.gradient import GradRow, embedding_grad_products, ig_alphas

    model = SmoothToyLM()
    row = GradRow(ids=(1, 2, 3, 4, 5, 6, 2, 3), attr_start=2, attr_end=6, answer_from=6, alpha=1.0)
    lp_one, _ = embedding_grad_products(model, [row])
    lp_zero, _ = embedding_grad_products(model, [replace(row, alpha=0.0)])
    gap = (lp_one - lp_zero).item()
    _, products = embedding_grad_products(model, [replace(row, alpha=a) for a in ig_alphas(64)])
    ig = torch.stack(products).mean(0)
    assert ig.shape == (4,)
    assert ig.sum().item() == pytest.approx(gap, rel=1e-3)
    _, plain = embedding_grad_products(model, [row])
    assert abs(plain[0].sum().item() - gap) > 1e-2 * abs(gap)


def test_gradient_runs_through_attribute(traces, policy):
    batch, plain = run_method("gradient", traces, policy)
    _, ig = run_method("gradient", traces, policy, ig_steps=2)
    assert not torch.allclose(torch.nan_to_num(plain.segment_credits), torch.nan_to_num(ig.segment_credits))
    last = plain.segment_credits.gather(1, (batch.num_segments - 1)[:, None])[:, 0]
    assert torch.all(last == 0)


def test_presets_compose():
    from rredcot_cli.config.compose import compose

    assert compose(["method=mc"]).method.k == 8
    assert compose(["method=loo", "method.score=value"]).method.score == "value"
    assert compose(["method=gradient", "method.ig_steps=4"]).method.ig_steps == 4
