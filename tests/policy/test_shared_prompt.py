"""Shared-prompt decode (rredcot_cli/policy/shared_prompt.py): a prompt's samples share its keys and values,
yet decode the tokens and log-probs of a copy per sample; and the 16-bit KV option."""

from __future__ import annotations

import pytest
import torch

from rredcot_cli.policy.base import SamplingParams
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.models import build_char_tokenizer
from rredcot_cli.policy.shared_prompt import prompt_groups

TEXTS = ["Compute mod 10: 1 +2 *3\n", "ab\n", "x\n", "Compute mod 10: 1 +2 *3\n"]


def _model(tok, kv_heads: int, eos_boost: float):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, intermediate_size=64, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[tok.eos_token_id] *= eos_boost  # rows stop at different lengths
    return model


def test_prompt_groups():
    assert prompt_groups([[1, 2], [3], [1, 2], [3], [4]]) == ([0, 1, 0, 1, 2], [0, 1, 4])
    assert prompt_groups([]) == ([], [])


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # plain, grouped-query and multi-query attention
@pytest.mark.parametrize("eos_boost", [3.0, 12.0])  # 12: many rows stop within a few tokens
def test_shared_prompts_decode_what_copies_decode(kv_heads, eos_boost):
    tok = build_char_tokenizer()
    model = _model(tok, kv_heads, eos_boost)
    prompts = [tok(t)["input_ids"] for t in TEXTS]  # the first and last are the same prompt
    before = model.config._attn_implementation
    for params in (SamplingParams(n=4, max_new_tokens=90, temperature=1.0),  # past the first capacity of 64
                   SamplingParams(n=3, max_new_tokens=40, temperature=0.7, top_p=0.9),
                   SamplingParams(n=2, max_new_tokens=40, temperature=0.0)):
        runs = {}
        for share in (False, True):
            backend = HFBackend(model, tok, batch_size=10, share_prompts=share)  # groups cut across batches
            runs[share] = [c for group in backend.generate(prompts, params, seed=13) for c in group]
            assert model.config._attn_implementation == before  # the model is given back as it was
        if params.temperature == 1.0:
            lengths = {len(c.token_ids) for c in runs[True]}
            assert len(lengths) > 2  # rows left the batch at different steps
        for a, b in zip(runs[False], runs[True]):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_rows_leave_before_the_first_generated_position():
    """Rows that stop at their first token leave the batch before the cache holds any generated
    position: the groups shrink (a prompt no row samples from is dropped) and decoding goes on."""
    from types import SimpleNamespace

    from rredcot_cli.policy.shared_prompt import shared_prompt_cache

    G, H, P, D = 3, 2, 5, 4
    prefill = SimpleNamespace(layers=[SimpleNamespace(keys=torch.randn(G, H, P, D), values=torch.randn(G, H, P, D))])
    cache = shared_prompt_cache(prefill, torch.ones(G, P, dtype=torch.bool), torch.tensor([0, 0, 1, 1, 2, 2]), 16)
    layer = cache.layers[0]
    layer.batch_select_indices(torch.tensor([1, 4, 5]))  # prompt 1 has no row left
    assert layer.prompt_keys.shape[0] == 2 and layer.row_group.tolist() == [0, 1, 1]
    assert layer.row_slot.tolist() == [0, 0, 1] and layer.slots == 2
    assert torch.equal(layer.prompt_keys[1], prefill.layers[0].keys[2])
    keys, _ = layer.update(torch.randn(3, H, 1, D), torch.randn(3, H, 1, D))
    assert keys.shape == (3, H, 1, D) and layer.get_seq_length() == P + 1


def test_bfloat16_kv_cache_stays_close_to_the_model():
    """Keys and values in bfloat16 change the numbers a little, not the distribution: the recorded
    log-probs stay within 0.05 nats of a float32 teacher-forced pass."""
    tok = build_char_tokenizer()
    model = _model(tok, 2, 3.0)
    prompts = [tok(t)["input_ids"] for t in TEXTS[:3]]
    backend = HFBackend(model, tok, batch_size=12, kv_dtype=torch.bfloat16, share_prompts=False)
    params = SamplingParams(n=4, max_new_tokens=60, temperature=1.0)
    flat = [c for group in backend.generate(prompts, params, seed=3) for c in group]
    scored, _ = backend.score([p for p in prompts for _ in range(4)], [c.token_ids for c in flat])
    gaps = torch.cat([(s - torch.tensor(c.logprobs)).abs() for s, c in zip(scored, flat)])
    assert 0 < gaps.max() < 0.05


def test_kv_cache_dtype_options():
    from rredcot_cli.errors import RredcotError
    from rredcot_cli.config.schema import BackendConfig, ModelConfig
    from rredcot_cli.policy.load import load_policy
    from rredcot_cli.train.update import old_from_sampler

    assert old_from_sampler("auto", "hf", "fp32", "none", "auto")
    assert not old_from_sampler("auto", "hf", "fp32", "none", "bfloat16")  # other numbers: recompute
    model = ModelConfig(chat_template=False)
    policy = load_policy(model, BackendConfig(name="hf", device="cpu", batch_size=8, kv_cache_dtype="bfloat16"), seed=0)
    assert policy.backend.kv_dtype is torch.bfloat16
    with pytest.raises(RredcotError, match="kv_cache_dtype=int8: unknown"):
        load_policy(model, BackendConfig(name="hf", device="cpu", batch_size=8, kv_cache_dtype="int8"), seed=0)
    with pytest.raises(RredcotError, match="option of backend=hf"):
        load_policy(model, BackendConfig(name="vllm", device="cpu", batch_size=8, kv_cache_dtype="bfloat16"), seed=0)
