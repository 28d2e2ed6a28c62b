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
        scored = packed_probe_logprobs(small_model, traces, probes, max_row_tokens=40, rows_per_forward=2, stats=stats)
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
