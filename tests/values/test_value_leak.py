"""No value estimator may see the trace's own outcome (issue 37).

For every registered estimator (built-ins and any plugin registered in this process) and every
trace of a mixed group: flip that trace's reward, nothing else, and none of its values V(S_i,k)
may move. Before issue 37 ``suffix_is`` counted the trace's own next segment (weight 1 on-policy,
utility R_i) and ``answer_probe`` its own verified answer, so both failed this test.
"""

from dataclasses import replace

import pytest
import torch

from rredcot_cli.methods.rredcot import segment_ends
from rredcot_cli.values.registry import (ValueSettings, get_value_estimator, register_value_estimator,
                                         value_estimator_names, _REGISTRY)
from tests.batches import tiny_chain_credit_batch


@pytest.fixture(scope="module")
def tiny_chain():
    return tiny_chain_credit_batch()


def traces_whose_values_follow_their_reward(name: str, settings: ValueSettings, tiny_chain) -> list[int]:
    """Indices of the traces whose values change when only their own reward is flipped."""
    policy, _, make_batch = tiny_chain
    estimator = get_value_estimator(name)
    batch = make_batch()
    offsets = [[0] + ends[:-1] for ends in segment_ends(batch)]  # S_0 and every inner boundary
    before = estimator.fn(batch, policy, offsets, settings)
    moved = []
    for i in range(len(offsets)):
        flipped = make_batch()
        flipped.rewards = flipped.rewards.clone()
        flipped.rewards[i] = 1.0 - flipped.rewards[i]
        after = estimator.fn(flipped, policy, offsets, settings)
        # Equal up to float noise: flipping R_i changes the *other* traces' probes, and with them
        # how the scorer batches every probe (a leak moves a value by far more, 0.1 or so).
        if not torch.allclose(before[i], after[i], rtol=0.0, atol=1e-5, equal_nan=True):
            moved.append(i)
    return moved


SETTINGS = [ValueSettings(), replace(ValueSettings(), self_normalised=True),
            replace(ValueSettings(), matched=False, window=0)]


@pytest.mark.parametrize("settings", SETTINGS, ids=["default", "self_normalised", "all_boundaries_whole_suffix"])
@pytest.mark.parametrize("name", value_estimator_names())
def test_no_estimator_sees_the_own_reward(name, settings, tiny_chain):
    assert traces_whose_values_follow_their_reward(name, settings, tiny_chain) == []


def test_the_check_catches_an_estimator_that_copies_the_reward(tiny_chain):
    """The control the judge also runs: V(S_k) = R_i. The check must flag every trace."""

    @register_value_estimator("copy_the_reward_for_test")
    def copy_the_reward(batch, policy, offsets, settings):
        return [torch.full((len(offs),), float(batch.rewards[i])) for i, offs in enumerate(offsets)]

    try:
        assert traces_whose_values_follow_their_reward("copy_the_reward_for_test", ValueSettings(),
                                                       tiny_chain) == [0, 1, 2, 3]
    finally:
        _REGISTRY.pop("copy_the_reward_for_test")


def test_suffix_is_with_the_own_suffix_put_back_is_caught(tiny_chain, monkeypatch):
    """Today's leave-one-out is what keeps ``suffix_is`` clean: letting a trace's own suffix back in
    (the estimator before issue 37) makes its values follow its reward."""
    import rredcot_cli.values.suffix_is as suffix_is

    real = suffix_is.suffix_is_values

    def with_own_suffix(model, traces, prompt_lens, boundaries, sampling, rewards, groups, **kwargs):
        # Give every trace a private twin group holding itself and a copy of it: the copy's suffix
        # is the trace's own continuation with the trace's own reward.
        n = len(traces)
        twins = real(model, traces + traces, prompt_lens + prompt_lens, boundaries + boundaries,
                     sampling + sampling, rewards + rewards, [*range(n), *range(n)], **kwargs)
        return twins[:n]

    monkeypatch.setattr(suffix_is, "suffix_is_values", with_own_suffix)
    assert traces_whose_values_follow_their_reward("suffix_is", ValueSettings(), tiny_chain) == [0, 1, 2, 3]
