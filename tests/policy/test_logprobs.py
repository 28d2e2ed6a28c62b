"""completion_logprobs: the chunked LM head equals one full pass (values, entropies, gradients),
and log-probs taken at the sampling temperature and top-p are those the sampler recorded."""

from __future__ import annotations

import pytest
import torch

from rredcot_cli.policy.base import SamplingParams
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.logprobs import completion_logprobs, nucleus_logits, token_logprobs
from rredcot_cli.policy.models import build_char_tokenizer, build_tiny_model

TOKENIZER = build_char_tokenizer()
PROMPTS = [TOKENIZER(t)["input_ids"] for t in ["Compute mod 10: 1 +2 *3\n", "ab\n", "x=3: f=17 no\n"]]
COMPLETIONS = [TOKENIZER(t)["input_ids"] for t in ["1+2=3\n3*3=9\nAnswer: 9", "ok", "x=4: f=20 yes\nAnswer: 4"]]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_tiny_model(len(TOKENIZER), hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128).eval()


@pytest.mark.parametrize("chunk", [1, 7, 1024])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_chunked_head_equals_one_pass(model, chunk, temperature, top_p):
    kwargs = dict(temperature=temperature, top_p=top_p)
    full_lp, full_mask, full_ent = completion_logprobs(model, PROMPTS, COMPLETIONS, 0, True, chunk_tokens=0, **kwargs)
    lp, mask, ent = completion_logprobs(model, PROMPTS, COMPLETIONS, 0, True, chunk_tokens=chunk, **kwargs)
    assert torch.equal(mask, full_mask)
    assert torch.allclose(lp, full_lp, atol=1e-5) and torch.allclose(ent, full_ent, atol=1e-5)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()

    weights = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))

    def grads(chunk_tokens):
        model.zero_grad(set_to_none=True)
        out, m, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, 0, False, chunk_tokens=chunk_tokens, **kwargs)
        (out * weights * m).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    expected, got = grads(0), grads(chunk)
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-5), name


def test_models_with_logit_postprocessing_take_the_full_pass(model, monkeypatch):
    """Soft-capped logits (Gemma) are not lm_head(hidden): chunking must not bypass the model."""
    heads = []
    monkeypatch.setattr(model, "get_output_embeddings", lambda: heads.append(1) or model.lm_head)
    completion_logprobs(model, PROMPTS, COMPLETIONS, 0, False, chunk_tokens=4)
    assert heads == [1]  # plain Llama: the head is run in chunks
    model.config.final_logit_softcapping = 30.0  # the tiny Llama ignores it; the path choice does not
    try:
        lp, _, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, 0, False, chunk_tokens=4)
    finally:
        del model.config.final_logit_softcapping
    assert heads == [1] and lp.shape == (3, max(len(c) for c in COMPLETIONS))


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9), (1.3, 0.8)])
def test_scores_at_the_sampling_distribution_match_what_generate_recorded(model, temperature, top_p):
    backend = HFBackend(model, TOKENIZER, batch_size=8)
    params = SamplingParams(n=3, max_new_tokens=16, temperature=temperature, top_p=top_p)
    groups = backend.generate(PROMPTS, params, seed=4)
    prompts = [p for p, g in zip(PROMPTS, groups) for _ in g]
    completions = [c.token_ids for g in groups for c in g]
    recorded = [torch.tensor(c.logprobs) for g in groups for c in g]
    with torch.no_grad():
        lp, mask, _ = completion_logprobs(model, prompts, completions, 0, False, temperature=temperature,
                                          top_p=top_p, chunk_tokens=5)
    for i, rec in enumerate(recorded):
        assert torch.allclose(lp[i, : len(rec)], rec, atol=1e-4), (lp[i, : len(rec)] - rec).abs().max()
    if temperature != 1.0:  # and the model's own distribution is a different one
        with torch.no_grad():
            plain, _, _ = completion_logprobs(model, prompts, completions, 0, False)
        assert not torch.allclose(plain[mask], lp[mask], atol=1e-3)


def test_nucleus_by_hand_and_the_sampled_token_stays_in_it():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = nucleus_logits(logits, top_p=0.7)
    assert torch.isfinite(kept[0, :2]).all() and torch.isinf(kept[0, 2:]).all()  # 0.5 + 0.3 >= 0.7
    lp, ent = token_logprobs(logits, torch.tensor([1]), top_p=0.7, with_entropy=True)
    assert float(lp) == pytest.approx(float(torch.log(torch.tensor(0.3 / 0.8))), abs=1e-6)
    p = torch.tensor([0.5, 0.3]) / 0.8
    assert float(ent) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)
    # A token the trainer's nucleus would drop (a sampler with other numerics kept it): finite.
    lp, _ = token_logprobs(logits, torch.tensor([3]), top_p=0.7)
    assert torch.isfinite(lp).all()
    assert float(lp) == pytest.approx(float(torch.log(torch.tensor(0.05 / 0.85))), abs=1e-6)


def test_greedy_has_no_distribution(model):
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(model, PROMPTS, COMPLETIONS, 0, False, temperature=0.0)
