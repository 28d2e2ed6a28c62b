"""Issue 13: what the speed levers must leave unchanged, and the per-phase step timings."""

from __future__ import annotations

import time

import pytest

from rredcot_cli.train.steptime import PHASES, StepClock


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
    from rredcot_cli.train.loop import _with_phase_columns

    old = [{"step": 1, "seconds": 2.0}]
    rows = _with_phase_columns(old)
    assert rows[0]["seconds_sampling"] is None and rows[0]["credit_forward_tokens"] is None
    assert rows[0]["advantage_std"] is None
    assert rows[0]["seconds"] == 2.0


# --------------------------------------------------------------------------- probe merging


@pytest.fixture(scope="module")
def small_model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256)
    return Qwen2ForCausalLM(config).eval()


def _shared_prefix_traces():
    """Three traces of one group: 0 and 1 agree on their first 12 tokens, 2 on the first 5."""
    import torch

    g = torch.Generator().manual_seed(3)
    stem = torch.randint(0, 40, (12,), generator=g).tolist()
    return [stem + torch.randint(0, 40, (10,), generator=g).tolist(),
            stem + torch.randint(0, 40, (14,), generator=g).tolist(),
            stem[:5] + torch.randint(0, 40, (20,), generator=g).tolist()]


def _duplicated_probes(traces):
    from rredcot_cli.values.packing import Probe

    probes = []
    for t, trace in enumerate(traces):
        for prefix in (3, 5, 8, 12):
            for j, other in enumerate(traces):  # every trace's next 4 tokens after this prefix
                tokens = tuple(other[prefix : prefix + 4])
                probes.append(Probe(trace=t, prefix_len=prefix, tokens=tokens, scored_from=j % 2))
    return probes


def test_merge_probes_keeps_one_probe_per_prefix_tokens_and_suffix():
    from rredcot_cli.values.packing import merge_probes

    traces = _shared_prefix_traces()
    probes = _duplicated_probes(traces)
    merged, where = merge_probes(traces, probes)
    assert len(where) == len(probes) and len(merged) < len(probes)
    for probe, w in zip(probes, where):
        kept = merged[w]
        assert traces[kept.trace][: kept.prefix_len] == traces[probe.trace][: probe.prefix_len]
        assert (kept.prefix_len, kept.tokens, kept.scored_from) == (probe.prefix_len, probe.tokens, probe.scored_from)
    # A probe that some trace continues with after the same prefix lives on that trace.
    for kept in merged:
        continuing = [t for t, trace in enumerate(traces)
                      if trace[: kept.prefix_len] == traces[kept.trace][: kept.prefix_len]
                      and tuple(trace[kept.prefix_len : kept.prefix_len + len(kept.tokens)]) == kept.tokens]
        assert not continuing or kept.trace in continuing
    assert len({(tuple(traces[m.trace][: m.prefix_len]), m.tokens, m.scored_from) for m in merged}) == len(merged)


@pytest.mark.parametrize("scorer", ["packed", "kv_cache"])
def test_merged_probes_score_as_each_prefix_from_scratch(small_model, scorer):
    import torch

    from rredcot_cli.values.packing import cached_probe_logprobs, packed_probe_logprobs, unpacked_probe_logprobs

    traces = _shared_prefix_traces()
    probes = _duplicated_probes(traces)
    stats = {}
    if scorer == "packed":
        scored = packed_probe_logprobs(small_model, traces, probes, max_row_tokens=40, rows_per_forward=2,
                                       stats=stats)
    else:
        scored = cached_probe_logprobs(small_model, traces, probes, traces_per_forward=2, row_tokens=12,
                                       max_probe_tokens=30, stats=stats)
    reference = unpacked_probe_logprobs(small_model, traces, probes)
    for probe, a, b in zip(probes, scored, reference):
        assert a.shape == b.shape == (len(probe.tokens) - probe.scored_from,)
        assert torch.allclose(a, b, atol=1e-5)
    if scorer == "kv_cache":
        # Only the distinct probes that no trace continues with are run after the encoding pass.
        from rredcot_cli.values.packing import merge_probes

        merged, _ = merge_probes(traces, probes)
        encoded = len(traces) * max(len(t) for t in traces)
        run = [m for m in merged if tuple(traces[m.trace][m.prefix_len : m.prefix_len + len(m.tokens)]) != m.tokens]
        assert stats["forward_tokens"] <= encoded + 2 * sum(len(m.tokens) + 1 for m in run)
        assert stats["forward_tokens"] < encoded + sum(len(p.tokens) + 1 for p in probes)


# --------------------------------------------------------------------------- the update


def test_micro_batches_sort_by_length_and_keep_the_budget():
    from rredcot_cli.policy.logprobs import micro_batches

    prompts = [[1] * n for n in (3, 5, 4, 2, 6, 3, 4)]
    completions = [[2] * n for n in (10, 2, 7, 30, 1, 5, 9)]
    rows = [6, 0, 3, 2, 5, 1, 4]
    parts = micro_batches(rows, prompts, completions, max_rows=3, max_tokens=40)
    assert sorted(i for part in parts for i in part) == sorted(rows)
    order = [i for part in parts for i in part]
    lengths = [len(prompts[i]) + len(completions[i]) for i in order]
    assert lengths == sorted(lengths)
    for part in parts:
        assert len(part) <= 3
        width = max(len(prompts[i]) for i in part) + max(len(completions[i]) for i in part)
        assert len(part) == 1 or len(part) * width <= 40
    assert [3] in parts  # 32 positions alone: over no budget, but a row of its own
    # No budget: runs of max_rows in the given order (one pass at most max_rows; DDP shares line up).
    assert micro_batches(rows, prompts, completions, max_rows=4) == [rows[:4], rows[4:]]


def _tiny_update(model, *, micro_tokens=0, old_from_sampler=False, sampler=None, updates=2):
    import torch

    from rredcot_cli.policy.models import build_char_tokenizer
    from rredcot_cli.train.update import UpdateBatch, UpdateEngine, UpdateHyper, policy_update
    from rredcot_cli.policy.logprobs import ForwardPass
    from rredcot_cli.train.loss import LossSettings

    tok = build_char_tokenizer()
    prompts = [tok(t)["input_ids"] for t in ["3+4\n", "ab\n", "7*2-1\n", "q\n", "x=3?\n", "9-9\n"]]
    completions = [tok(t)["input_ids"] for t in ["7", "ok ok", "13\nAnswer: 3", "no", "x=3: f=1 no", "0\n0"]]
    T = max(len(c) for c in completions)
    adv = torch.randn(len(completions), 1, generator=torch.Generator().manual_seed(0)).expand(-1, T).clone()
    for i, c in enumerate(completions):
        adv[i, len(c):] = 0
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    if sampler == "teacher-forced":
        from rredcot_cli.policy.logprobs import chunked_completion_logprobs

        sampler, _, _ = chunked_completion_logprobs(model, prompts, completions, 0, 6)
    stats = policy_update(
        model, opt, sched,
        UpdateBatch(prompt_ids=prompts, completion_ids=completions, advantages=adv, pad_id=0,
                    sampler_logprobs=sampler),
        UpdateHyper(updates_per_batch=updates, minibatch_size=4, loss=LossSettings(clip_low=0.2, clip_high=0.2,
                    loss_agg="token-mean", max_tokens=12), old_from_sampler=old_from_sampler),
        UpdateEngine(generator=torch.Generator().manual_seed(0),
                     forward=ForwardPass(chunk_tokens=5, micro_batch_tokens=micro_tokens)))
    return stats


@pytest.fixture()
def tiny_policy():
    import torch

    from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model

    torch.manual_seed(0)
    return build_tiny_model(len(build_char_tokenizer()), hidden_size=32, num_layers=2, num_heads=2,
                            intermediate_size=64).eval()


def test_token_budget_micro_batches_give_the_one_pass_update(tiny_policy):
    import copy

    import torch

    ref, cut = copy.deepcopy(tiny_policy), copy.deepcopy(tiny_policy)
    a = _tiny_update(ref)
    b = _tiny_update(cut, micro_tokens=24)  # 4-row minibatches of 6-17 positions: 2-4 passes each
    for (name, x), y in zip(ref.state_dict().items(), cut.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6), name
    assert b.loss == pytest.approx(a.loss, abs=1e-5) and b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)


def test_sampler_logprobs_as_old_give_the_recomputed_update(tiny_policy):
    """With the sampler's numbers equal to the trainer's, skipping the pre-update pass changes
    nothing but where the entropy is measured (the first pass's forwards) and sampler_kl (NaN)."""
    import copy
    import math

    import torch

    ref, reused = copy.deepcopy(tiny_policy), copy.deepcopy(tiny_policy)
    a = _tiny_update(ref, sampler="teacher-forced")
    b = _tiny_update(reused, sampler="teacher-forced", old_from_sampler=True)
    for (name, x), y in zip(ref.state_dict().items(), reused.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6), name
    assert b.loss == pytest.approx(a.loss, abs=1e-6) and b.clip_fraction == pytest.approx(a.clip_fraction)
    assert abs(a.sampler_kl) < 1e-6 and math.isnan(b.sampler_kl)
    assert 0 < b.entropy and b.entropy == pytest.approx(a.entropy, rel=0.2)  # measured while the policy moves


def test_old_logprobs_auto_reuses_the_sampler_only_where_it_is_the_trained_model():
    from rredcot_cli.train.update import old_from_sampler

    assert old_from_sampler("auto", "hf", "fp32", "none")
    assert not old_from_sampler("auto", "vllm", "fp32", "none")
    assert not old_from_sampler("auto", "hf", "bf16-mixed", "none")
    assert not old_from_sampler("auto", "hf", "fp32", "token_truncate")
    assert old_from_sampler("sampler", "vllm", "fp32", "none") and not old_from_sampler("recompute", "hf", "fp32",
                            "none")
    with pytest.raises(ValueError, match="use recompute"):
        old_from_sampler("sampler", "hf", "fp32", "token_mask")


# --------------------------------------------------------------------------- HF decoding


def test_growing_cache_decodes_the_same_tokens_and_logprobs():
    """The HF backend's growing KV cache stores the same keys and values as transformers' default
    (which concatenates the whole cache per token): same seed, same completions, same numbers."""
    import torch

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.kvcache import growing_cache
    from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id).eval()
    prompts = [tok(t)["input_ids"] for t in ["Compute mod 10: 1 +2 *3\n", "ab\n", "x\n"]]
    params = SamplingParams(n=3, max_new_tokens=90, temperature=1.0)  # past the first capacity of 64
    runs = {}
    for growing in (False, True):
        backend = HFBackend(model, tok, batch_size=9, growing_cache=growing)
        runs[growing] = [c for group in backend.generate(prompts, params, seed=5) for c in group]
    assert max(len(c.token_ids) for c in runs[True]) > 64
    for a, b in zip(runs[False], runs[True]):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6)
    cache = growing_cache(model, 100)
    assert cache is not None and all(type(layer).__name__ == "GrowingLayer" for layer in cache.layers)


def test_compacting_decode_gives_the_tokens_generate_gives():
    """Rows that finished leave the batch, yet every step draws one sample per original row, so the
    random stream and the completions are transformers' generate's (tokens equal, log-probs to
    rounding), under temperature and top-p, and greedy."""
    import torch

    from rredcot_cli.policy.base import SamplingParams
    from rredcot_cli.policy.hf import HFBackend
    from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.eos_token_id] *= 3  # rows stop at different lengths
    prompts = [tok(t)["input_ids"] for t in ["Compute mod 10: 1 +2 *3\n", "ab\n", "x\n", "7-7\n"]]
    for params in (SamplingParams(n=4, max_new_tokens=60, temperature=1.0),
                   SamplingParams(n=4, max_new_tokens=60, temperature=0.7, top_p=0.9),
                   SamplingParams(n=2, max_new_tokens=60, temperature=0.0)):
        runs = {}
        for compact in (False, True):
            backend = HFBackend(model, tok, batch_size=16, compact=compact)
            runs[compact] = [c for group in backend.generate(prompts, params, seed=13) for c in group]
        finished = sum(c.finish_reason == "stop" for c in runs[True])
        assert finished * 4 >= len(runs[True]) and len({len(c.token_ids) for c in runs[True]}) > 2  # rows left
        for a, b in zip(runs[False], runs[True]):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_advantage_std_is_over_completion_tokens_only():
    """advantages [[1, 3, 9], [2, 9, 9]] with the 9s on padding: std of {1, 3, 2} = 1 (n-1)."""
    import torch

    from rredcot_cli.train.loop import _advantage_std

    advantages = torch.tensor([[1.0, 3.0, 9.0], [2.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert _advantage_std(advantages, mask) == pytest.approx(1.0)
    assert _advantage_std(advantages, torch.tensor([[1, 0, 0], [0, 0, 0]])) is None


def test_phase_observers_see_every_phase_open_and_close(monkeypatch):
    """steptime.PHASE_OBSERVERS, the seam bench/scaling.py times the loop through: each observer
    hears a phase open before its clock starts and close after it stops, nested phases inside
    their parent, and the clock's exclusive seconds are what they were without observers."""
    from rredcot_cli.train import steptime

    heard = []
    monkeypatch.setattr(steptime, "PHASE_OBSERVERS", [lambda event, name: heard.append((event, name))])
    clock = steptime.StepClock()
    with clock.phase("update"):
        with clock.phase("old_logprobs"):
            pass
    with clock.phase("refresh"):
        pass
    assert heard == [("begin", "update"), ("begin", "old_logprobs"), ("end", "old_logprobs"), ("end", "update"),
                     ("begin", "refresh"), ("end", "refresh")]
    assert set(clock.columns()) == {f"seconds_{name}" for name in steptime.PHASES}
