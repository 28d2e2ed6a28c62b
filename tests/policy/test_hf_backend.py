"""HFBackend: generate, score and the differentiable completion_logprobs, on a random tiny model."""

from __future__ import annotations

import pytest
import torch

from rredcot_cli.policy.base import SamplingParams
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.logprobs import completion_logprobs, pack_prompt_completion
from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model

PROMPT_TEXTS = ["Compute mod 10: 1 +2 *3\n", "ab\n", "Find the first x in 1 2 with (3x+1)%10=7\n"]
PROMPTS = [build_char_tokenizer()(text)["input_ids"] for text in PROMPT_TEXTS]  # backends take token ids


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    m = build_tiny_model(len(tokenizer), hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    # Make EOS likely so that some completions stop by themselves.
    with torch.no_grad():
        m.model.embed_tokens.weight[tokenizer.eos_token_id] *= 8
    return m.eval()


@pytest.fixture(scope="module")
def backend(model, tokenizer):
    return HFBackend(model, tokenizer, batch_size=4)


def _flat(groups):
    return [c for g in groups for c in g]


def test_generate_shapes_and_eos(backend, tokenizer):
    params = SamplingParams(n=3, max_new_tokens=24, temperature=1.0)
    groups = backend.generate(PROMPTS, params, seed=0)
    assert len(groups) == len(PROMPTS) and all(len(g) == 3 for g in groups)
    reasons = set()
    for c in _flat(groups):
        assert len(c.token_ids) == len(c.logprobs) >= 1
        assert all(lp <= 1e-6 for lp in c.logprobs)
        reasons.add(c.finish_reason)
        eos_positions = [i for i, t in enumerate(c.token_ids) if t == tokenizer.eos_token_id]
        if c.finish_reason == "stop":
            assert eos_positions == [len(c.token_ids) - 1]
        else:
            assert c.finish_reason == "length" and not eos_positions and len(c.token_ids) == 24
        assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert reasons == {"stop", "length"}  # the fixture makes both happen


def test_generate_deterministic_with_seed(backend):
    params = SamplingParams(n=2, max_new_tokens=16, temperature=1.0)
    a = backend.generate(PROMPTS, params, seed=3)
    b = backend.generate(PROMPTS, params, seed=3)
    c = backend.generate(PROMPTS, params, seed=4)
    ids = lambda groups: [x.token_ids for x in _flat(groups)]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    # the global RNG is left alone
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    backend.generate(PROMPTS[:1], params, seed=5)
    assert torch.equal(torch.rand(1), expected)


def test_greedy_is_deterministic_and_batch_independent(model, tokenizer):
    params = SamplingParams(n=1, max_new_tokens=16, temperature=0.0)
    batched = HFBackend(model, tokenizer, batch_size=8).generate(PROMPTS, params, seed=0)
    alone = [HFBackend(model, tokenizer, batch_size=1).generate([p], params, seed=1)[0] for p in PROMPTS]
    assert [g[0].token_ids for g in batched] == [g[0].token_ids for g in alone]


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generate_logprobs_match_score(backend, temperature):
    params = SamplingParams(n=2, max_new_tokens=20, temperature=temperature)
    groups = backend.generate(PROMPTS, params, seed=1)
    prompt_ids = PROMPTS
    flat = _flat(groups)
    p_ids = [prompt_ids[i] for i in range(len(PROMPTS)) for _ in range(params.n)]
    scored, ent = backend.score(p_ids, [c.token_ids for c in flat], with_entropy=True)
    for c, lp, e in zip(flat, scored, ent):
        assert lp.dtype == torch.float32 and lp.shape == (len(c.token_ids),)
        assert torch.allclose(lp, torch.tensor(c.logprobs), atol=1e-4)
        assert e.shape == lp.shape and (e >= -1e-5).all()


def test_logprobs_under_temperature_and_top_p(backend, model, tokenizer):
    """Recorded log-probs are those of the warped distribution the token was drawn from."""
    t, top_p = 0.7, 0.9
    groups = backend.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=8, temperature=t, top_p=top_p), seed=2)
    prompt = PROMPTS[0]
    for c in groups[0]:
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / t  # (T, V)
        probs = torch.softmax(logits, -1)
        sorted_p, order = probs.sort(-1, descending=True)
        # nucleus as in transformers' TopPLogitsWarper: drop tokens whose ascending cumsum <= 1 - top_p
        keep_sorted = sorted_p.flip(-1).cumsum(-1).flip(-1) > 1 - top_p
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        masked = logits.masked_fill(~keep, float("-inf"))
        expected = torch.log_softmax(masked, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_score_left_padding_invariance(backend, tokenizer):
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    short_p, short_c = enc("ab\n"), enc("1+2=3")
    long_p, long_c = enc("Compute mod 10: 1 +2 *3 -4 +5\n"), enc("1+2=3\n3*3=9\n9-4=5\n5+5=0\nAnswer: 0")
    alone, _ = backend.score([short_p], [short_c])
    mixed, _ = backend.score([long_p, short_p, long_p], [long_c, short_c, short_c])
    assert torch.allclose(alone[0], mixed[1], atol=1e-5)
    long_alone, _ = backend.score([long_p], [short_c])
    assert torch.allclose(long_alone[0], mixed[2], atol=1e-5)
    # chunking across batches does not change results either
    chunked, _ = HFBackend(backend.model, tokenizer, batch_size=1).score([long_p, short_p], [long_c, short_c])
    assert torch.allclose(chunked[0], mixed[0], atol=1e-5) and torch.allclose(chunked[1], mixed[1], atol=1e-5)


def test_score_matches_plain_forward(backend, model, tokenizer):
    p, c = tokenizer.encode("xy\n", add_special_tokens=False), tokenizer.encode("1+1=2", add_special_tokens=False)
    scored, _ = backend.score([p], [c])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([p + c])).logits[0]
    expected = torch.log_softmax(logits[len(p) - 1 : -1], -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
    assert torch.allclose(scored[0], expected, atol=1e-5)


def test_pack_layout():
    ids, attn, mask, width_p = pack_prompt_completion([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=0)
    assert width_p == 2
    assert ids.tolist() == [[5, 6, 8, 0, 0], [0, 7, 9, 10, 11]]
    assert attn.tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert mask.tolist() == [[True, False, False], [True, True, True]]


def test_completion_logprobs_has_gradients(model, tokenizer):
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    prompts = [enc("ab\n"), enc("Compute mod 10: 1 +2\n")]
    completions = [enc("1+2=3\nAnswer: 3"), enc("1")]
    model.zero_grad(set_to_none=True)
    logprobs, mask, entropies = completion_logprobs(model, prompts, completions, tokenizer.pad_token_id)
    assert logprobs.shape == mask.shape == entropies.shape == (2, len(completions[0]))
    assert mask.sum().item() == sum(len(c) for c in completions)
    assert (logprobs[~mask] == 0).all() and (entropies[~mask] == 0).all()
    assert logprobs.requires_grad
    (logprobs.sum() + 0.01 * entropies.sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def test_sync_weights(backend, model):
    other = object()
    backend.sync_weights(other)
    assert backend.model is other
    backend.sync_weights(model)
