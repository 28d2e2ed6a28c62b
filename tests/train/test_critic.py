"""The PPO critic (rredcot_cli/train/critic.py): where values are read in a packed row, the clipped value
loss, fitting, non-finite skipping, explained variance, and checkpoint round trips."""

import io
import math
import re

import pytest
import torch

from rredcot_cli.train.critic import CriticStats, ValueCritic, explained_variance, value_loss

PAD = 0
# Prompts and completions of different lengths (one completion empty), so rows carry left and
# right padding of different widths.
PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [14, 15]]
COMPLETIONS = [[20, 21, 22, 23], [24, 25], [], [26, 27, 28, 29, 30, 31]]


def tiny_policy(hidden_size=32, seed=0):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=50, hidden_size=hidden_size, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def policy():
    return tiny_policy()


def lengths_mask(completions):
    T = max(len(c) for c in completions)
    mask = torch.zeros(len(completions), T, dtype=torch.bool)
    for i, c in enumerate(completions):
        mask[i, : len(c)] = True
    return mask


def weights(critic):
    return {k: v.detach().clone() for k, v in critic.module.state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- values


def test_untrained_critic_says_zero_everywhere(policy):
    critic = ValueCritic.from_policy(policy, pad_id=PAD, minibatch_size=3)
    values = critic.values(PROMPTS, COMPLETIONS)
    assert values.shape == (4, 6) and values.dtype == torch.float32 and values.device.type == "cpu"
    assert torch.equal(values, torch.zeros(4, 6))
    assert critic.values([[1]], [[]]).shape == (1, 0)


def gpt2_policy():
    """Absolute position embeddings: unlike rotary ones (relative), they change the output when
    position ids count the left padding, so the check below also pins the position ids."""
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_values_are_the_head_on_the_last_hidden_state_of_each_unpadded_prefix(policy, arch):
    if arch == "gpt2":
        policy = gpt2_policy()
    critic = ValueCritic.from_policy(policy, pad_id=PAD, minibatch_size=3)  # two chunks: 3 + 1 rows
    torch.manual_seed(1)
    with torch.no_grad():
        critic.module.head.weight.normal_()
        critic.module.head.bias.normal_()
    values = critic.values(PROMPTS, COMPLETIONS)
    head = critic.module.head
    decoder = policy.get_decoder()  # the policy's own body: the critic's copy must match it
    mask = lengths_mask(COMPLETIONS)
    assert torch.equal(values[~mask], torch.zeros(int((~mask).sum())))  # exactly 0 on padding
    checked = 0
    with torch.no_grad():
        for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS)):
            for t in range(len(c)):
                prefix = torch.tensor([p + c[:t]])  # s_t = prompt + completion[:t], no padding
                hidden = decoder(input_ids=prefix, use_cache=False).last_hidden_state[0, -1]
                expected = float(head(hidden))
                assert values[i, t].item() == pytest.approx(expected, abs=1e-5), (i, t)
                checked += 1
    assert checked == int(mask.sum())
    assert values.abs().max() > 0.1  # the check above was not 0 == 0


def test_critic_is_a_copy_of_the_policy_body(policy):
    critic = ValueCritic.from_policy(policy, pad_id=PAD)
    body = policy.get_decoder()
    assert critic.module.backbone is not body
    assert critic.hidden_size == policy.config.hidden_size
    own = dict(body.named_parameters())
    for name, param in critic.module.backbone.named_parameters():
        assert torch.equal(param, own[name]) and param.data_ptr() != own[name].data_ptr()
    assert torch.count_nonzero(critic.module.head.weight) == 0 and torch.count_nonzero(critic.module.head.bias) == 0


# --------------------------------------------------------------------------- loss


def test_value_loss_by_hand():
    # token 0: V=1, V_old=0, R=2  -> unclipped (1-2)^2 = 1,  clipped (0.5-2)^2 = 2.25: the clipped term wins
    # token 1: V=1, V_old=0, R=-1 -> unclipped (1+1)^2 = 4,  clipped (0.5+1)^2 = 2.25: the unclipped term wins
    # token 2: padding (NaN return) -> ignored
    # row 2, token 0: V=0, V_old=0, R=3 -> both 9 (equal: not counted as clipped)
    values = torch.tensor([[1.0, 1.0, 5.0], [0.0, 7.0, 7.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, -1.0, float("nan")], [3.0, float("nan"), 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])

    loss, clip_fraction = value_loss(values, old, returns, mask, value_clip=0.5)
    assert loss.item() == pytest.approx(0.5 * (2.25 + 4.0 + 9.0) / 3)
    assert clip_fraction == pytest.approx(1 / 3)
    loss.backward()
    # d/dV: 0 where the clipped term wins (V is outside the clip range there); (V-R)/n elsewhere
    expected_grad = torch.tensor([[0.0, (1.0 + 1.0) / 3, 0.0], [(0.0 - 3.0) / 3, 0.0, 0.0]])
    assert torch.allclose(values.grad, expected_grad)

    plain, plain_fraction = value_loss(values.detach(), old, returns, mask, value_clip=0.0)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 4.0 + 9.0) / 3)
    assert plain_fraction == 0.0

    none, none_fraction = value_loss(values.detach(), old, returns, torch.zeros_like(mask), value_clip=0.5)
    assert none.item() == 0.0 and none_fraction == 0.0


def test_explained_variance_by_hand(policy):
    # valid returns 1,2,3,4 (Var 1.25); residuals R - V_old = 0,0,1,2 (Var 0.6875): EV = 1 - 0.55
    returns = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    old = torch.tensor([[1.0, 2.0, 2.0], [2.0, 100.0, -100.0]])  # padding garbage must not count
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert explained_variance(old, returns, mask) == pytest.approx(0.45)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert math.isnan(explained_variance(old, torch.full_like(returns, 2.0), mask))

    critic = ValueCritic.from_policy(policy, pad_id=PAD, updates_per_batch=0)
    stats = critic.fit([[1, 2], [3]], [[4, 5, 6], [7]], old, returns)
    assert stats.explained_variance == pytest.approx(0.45)
    assert stats.updates == 0 and stats.skipped == 0 and math.isnan(stats.value_loss)


# --------------------------------------------------------------------------- fitting


def test_fit_moves_values_to_the_returns_and_leaves_the_policy_alone(policy):
    before_policy = {k: v.clone() for k, v in policy.state_dict().items()}
    critic = ValueCritic.from_policy(policy, pad_id=PAD, lr=1e-2, minibatch_size=2, updates_per_batch=2)
    mask = lengths_mask(COMPLETIONS)
    targets = torch.tensor([1.0, -0.5, 0.3, 0.8])[:, None].expand_as(mask)
    returns = torch.where(mask, targets, torch.zeros_like(targets))

    def mse(values):
        return float(((values - returns)[mask] ** 2).mean())

    first = critic.values(PROMPTS, COMPLETIONS)
    start = mse(first)
    losses = []
    for _ in range(12):  # as the stage would: fresh old values every step, then fit
        old = critic.values(PROMPTS, COMPLETIONS)
        stats = critic.fit(PROMPTS, COMPLETIONS, old, returns)
        assert isinstance(stats, CriticStats)
        assert stats.updates == 4 and stats.skipped == 0
        assert math.isfinite(stats.grad_norm) and 0.0 <= stats.clip_fraction <= 1.0
        losses.append(stats.value_loss)
    end = mse(critic.values(PROMPTS, COMPLETIONS))
    assert end < 0.1 * start, (start, end, losses)
    assert losses[-1] < 0.1 * losses[0]
    assert stats.explained_variance > 0.5  # the critic now explains most of the per-row returns
    assert critic.module.training is False
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before_policy[k]), k


def test_nonfinite_returns_skip_the_step_and_leave_the_weights(policy):
    critic = ValueCritic.from_policy(policy, pad_id=PAD, lr=1e-2, minibatch_size=2, updates_per_batch=2)
    mask = lengths_mask(COMPLETIONS)
    old = critic.values(PROMPTS, COMPLETIONS)
    before = weights(critic)
    nan_returns = torch.where(mask, torch.full(mask.shape, float("nan")), torch.zeros(mask.shape))
    stats = critic.fit(PROMPTS, COMPLETIONS, old, nan_returns)
    assert stats.updates == 0 and stats.skipped == 4  # 2 passes x 2 minibatches
    assert math.isnan(stats.value_loss) and math.isnan(stats.grad_norm)
    assert same_weights(before, weights(critic))
    assert len(critic.optimizer.state) == 0  # no AdamW moments either

    # One bad row: only the minibatches holding it are skipped (once per pass).
    returns = torch.where(mask, torch.ones(mask.shape), torch.zeros(mask.shape))
    returns[3, 2] = float("nan")
    stats = critic.fit(PROMPTS, COMPLETIONS, old, returns)
    assert stats.updates == 2 and stats.skipped == 2 and math.isfinite(stats.value_loss)
    assert not same_weights(before, weights(critic))

    # A finite loss with a non-finite gradient is skipped as well.
    before = weights(critic)
    hook = critic.module.head.weight.register_hook(lambda grad: grad * float("nan"))
    stats = critic.fit(PROMPTS, COMPLETIONS, old, returns.nan_to_num())
    hook.remove()
    assert stats.updates == 0 and stats.skipped == 4 and math.isnan(stats.value_loss)
    assert same_weights(before, weights(critic))

    # NaN on padding is not a non-finite step: padding never reaches the loss or its gradient.
    padded_nan = torch.where(mask, torch.ones(mask.shape), torch.full(mask.shape, float("nan")))
    stats = critic.fit(PROMPTS, COMPLETIONS, old, padded_nan)
    assert stats.updates == 4 and stats.skipped == 0 and math.isfinite(stats.grad_norm)


def test_fit_checks_shapes(policy):
    critic = ValueCritic.from_policy(policy, pad_id=PAD)
    with pytest.raises(ValueError, match="returns"):
        critic.fit(PROMPTS, COMPLETIONS, torch.zeros(4, 6), torch.zeros(4, 5))


# --------------------------------------------------------------------------- state


def roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, map_location="cpu", weights_only=True)


def test_state_dict_round_trip_continues_identically(policy):
    def make():
        return ValueCritic.from_policy(policy, pad_id=PAD, lr=1e-2, minibatch_size=2, updates_per_batch=2, seed=7)

    mask = lengths_mask(COMPLETIONS)
    returns = torch.where(mask, torch.tensor([1.0, -0.5, 0.3, 0.8])[:, None].expand_as(mask), torch.zeros(mask.shape))
    zeros = torch.zeros(mask.shape)

    a = make()
    a.fit(PROMPTS, COMPLETIONS, zeros, returns)
    state = roundtrip(a.state_dict())
    assert set(state) == {"weights", "optimizer", "generator"}
    assert all(v.device.type == "cpu" for v in state["weights"].values())

    b = make()
    b.load_state_dict(state)
    assert same_weights(weights(a), weights(b))
    old = a.values(PROMPTS, COMPLETIONS)
    a.fit(PROMPTS, COMPLETIONS, old, returns)
    b.fit(PROMPTS, COMPLETIONS, old, returns)
    assert same_weights(weights(a), weights(b))

    # The test can fail: without the saved generator (minibatch order) or the AdamW moments the
    # next fit ends elsewhere.
    for part in ("generator", "optimizer"):
        fresh = make()
        partial = dict(state, **{part: roundtrip(fresh.state_dict())[part]})
        fresh.load_state_dict(partial)
        fresh.fit(PROMPTS, COMPLETIONS, old, returns)
        assert not same_weights(weights(a), weights(fresh)), part


def test_save_and_load_weights(policy, tmp_path):
    critic = ValueCritic.from_policy(policy, pad_id=PAD, lr=1e-2, minibatch_size=4)
    mask = lengths_mask(COMPLETIONS)
    critic.fit(PROMPTS, COMPLETIONS, torch.zeros(mask.shape), mask.float())
    path = tmp_path / "critic.pt"
    critic.save_weights(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["critic.pt"]  # no temporary left behind
    payload = torch.load(path, map_location="cpu", weights_only=True)
    assert payload["hidden_size"] == 32

    other = ValueCritic.from_policy(policy, pad_id=PAD)
    assert not same_weights(weights(critic), weights(other))
    other.load_weights(path)
    assert same_weights(weights(critic), weights(other))
    assert torch.equal(critic.values(PROMPTS, COMPLETIONS), other.values(PROMPTS, COMPLETIONS))

    small = ValueCritic.from_policy(tiny_policy(hidden_size=16), pad_id=PAD)
    small_path = tmp_path / "small.pt"
    small.save_weights(small_path)
    with pytest.raises(ValueError, match=re.escape(str(small_path))):
        critic.load_weights(small_path)

    missing = tmp_path / "missing.pt"
    partial = dict(payload["weights"])
    partial.pop("head.weight")
    torch.save({"weights": partial, "hidden_size": 32}, missing)
    with pytest.raises(ValueError, match=re.escape(str(missing)) + ".*head.weight"):
        critic.load_weights(missing)

    shape = tmp_path / "shape.pt"
    torch.save({"weights": dict(payload["weights"], **{"head.weight": torch.zeros(1, 31)})}, shape)
    with pytest.raises(ValueError, match=re.escape(str(shape)) + ".*head.weight"):
        critic.load_weights(shape)

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=re.escape(str(garbage))):
        critic.load_weights(garbage)
    assert same_weights(weights(critic), weights(other))  # failed loads changed nothing
