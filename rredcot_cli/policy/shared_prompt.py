"""Decode attention for samples that share a prompt: the prompt's keys and values are computed,
stored and read once per prompt instead of once per sample.

With n samples per prompt, each decode step of the HF backend reads every row's cached keys and
values, and after long prompts most of those bytes are n copies of the same prompt (a long decode
is bounded by these reads: docs/studies/throughput.md, bench/decode_attention.py). Here the prompts are
prefilled once each, and a decode step attends in two parts combined exactly through their
log-sum-exp, as cascade attention does (FlashInfer's "cascade inference", Ye et al. 2024; vLLM's
cascade attention): the queries of a prompt's rows together over the prompt's cache (one read for
n queries), and each row over its own generated positions. Same numbers up to float rounding.

Works for models whose attention layers take their function from ``config._attn_implementation``
(transformers' attention interface) and pass the model's keyword arguments on to it, as Llama,
Qwen2/3 and Mistral do; ``decode_attention`` switches the model to it for the decode steps only.
Full-attention layers only: a model with sliding-window or linear layers decodes the plain way
(``supported``). transformers is imported only when a cache is made, so that a transformers without
layered caches makes ``supported`` False instead of failing this module's import (version fallback).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from rredcot_cli.policy.kvcache import _layer_class as growing_layer_class

ATTENTION_NAME = "rredcot_shared_prompt"


def prompt_groups(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """(group of each row, first row of each group): rows with identical prompts form a group."""
    first: dict[tuple, int] = {}
    groups = [first.setdefault(tuple(p), len(first)) for p in prompts]
    starts = [0] * len(first)
    for row in reversed(range(len(prompts))):
        starts[groups[row]] = row
    return groups, starts


def supported(model) -> bool:
    """Whether every layer of ``model``'s cache would be a full-attention layer."""
    try:
        # deferred: version fallback (see the module docstring)
        from transformers.cache_utils import DynamicCache, DynamicLayer

        layers = DynamicCache(config=model.config).layers
    except Exception:  # noqa: BLE001 - an older transformers or a config it cannot lay out
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def shared_prompt_cache(prefill_cache, prompt_mask: torch.Tensor, row_group: torch.Tensor, max_length: int,
                        kv_dtype: torch.dtype | None = None):
    """A cache for the decode steps after ``prefill_cache`` (a cache filled by a forward over the
    distinct prompts, G rows, left-padded; ``prompt_mask`` (G, P) marks their real tokens):
    layer i keeps the prompts' keys and values once and grows each row's generated positions
    (``kvcache`` storage) for the B rows, row b sampling from prompt ``row_group[b]``. ``kv_dtype``:
    keys and values stored, and attention computed, in this dtype (default: the model's)."""
    from transformers.cache_utils import DynamicCache  # deferred: version fallback (see the module docstring)

    layer_class = _layer_class()
    bias = torch.zeros(prompt_mask.shape, dtype=torch.float32, device=prompt_mask.device)
    bias = bias.masked_fill(~prompt_mask.bool(), float("-inf"))[:, None, None, :]  # (G, 1, 1, P)
    cache = DynamicCache()
    cache.layers = []
    for prefilled in prefill_cache.layers:
        layer = layer_class()
        layer._limit, layer.kv_dtype = max_length, kv_dtype or prefilled.keys.dtype
        layer.prompt_keys, layer.prompt_values = prefilled.keys.to(layer.kv_dtype), prefilled.values.to(layer.kv_dtype)
        layer.prompt_bias = bias
        layer.set_groups(row_group)
        cache.layers.append(layer)
    cache.layer_class_to_replicate = None
    return cache


@contextmanager
def decode_attention(model):
    """The model's attention is the shared-prompt attention inside the block (pass the cache as
    ``shared_prompt=`` to the forward as well), its own again after it."""
    from transformers import AttentionInterface  # deferred: version fallback (see the module docstring)

    AttentionInterface.register(ATTENTION_NAME, _attention)
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, shared_prompt=None, **kwargs):
    """query (B, Hq, 1, D); key, value (B, Hkv, S, D): the rows' generated positions (this step's
    included); the prompt part from ``shared_prompt.layers[module.layer_idx]``. Returns
    ((B, 1, Hq, D), None) as transformers' attention functions do."""
    if shared_prompt is None or query.shape[2] != 1:
        raise RuntimeError("shared-prompt attention decodes one token per row with shared_prompt=<its cache>")
    layer = shared_prompt.layers[module.layer_idx]
    B, Hq, _, D = query.shape
    Hkv = key.shape[1]
    rep = Hq // Hkv  # query heads per key/value head (grouped-query attention): `rep` queries of one
    q = query.reshape(B, Hkv, rep, D).to(key.dtype)  # sequence, so no key or value is copied per query head
    scale = D**-0.5 if scaling is None else scaling
    # Prompt part: the rows of a group (G groups x `slots` rows) are `slots * rep` queries of one sequence.
    G, slots = layer.prompt_keys.shape[0], layer.slots
    if layer.in_order:  # rows are the groups' slots in order (no row has left): a view
        grouped = q.view(G, slots, Hkv, rep, D)
    else:
        grouped = q.new_zeros(G, slots, Hkv, rep, D)
        grouped[layer.row_group, layer.row_slot] = q
    grouped = grouped.transpose(1, 2).reshape(G, Hkv, slots * rep, D)
    out_p, lse_p = _attend(grouped, layer.prompt_keys, layer.prompt_values, layer.prompt_bias.to(q.dtype), scale)

    def by_row(x):  # (G, Hkv, slots * rep, ...) -> (B, Hkv, rep, ...)
        x = x.reshape(G, Hkv, slots, rep, *x.shape[3:]).transpose(1, 2)
        return x.reshape(B, *x.shape[2:]) if layer.in_order else x[layer.row_group, layer.row_slot]

    out_p, lse_p = by_row(out_p), by_row(lse_p)
    out_g, lse_g = _attend(q, key, value, None, scale)  # each row over its own generated positions
    # softmax over both parts = the parts' outputs weighted by their shares of the total exp-sum
    out = torch.lerp(out_g, out_p, torch.sigmoid(lse_p - lse_g)[..., None])
    return out.reshape(B, Hq, 1, D).transpose(1, 2).to(query.dtype), None


def _attend(q, k, v, bias, scale):
    """Softmax attention of q (N, H, L, D) over k, v (N, H, S, D) with an additive ``bias``
    broadcast to (N, H, L, S) or None: (output (N, H, L, D), log-sum-exp of the scores (N, H, L)).
    On CPU, torch's fused kernel (the one its scaled_dot_product_attention runs, which also returns
    the log-sum-exp); elsewhere the same in plain tensor ops."""
    if q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False,
                                                                              attn_mask=bias, scale=scale)
        return out, lse.to(out.dtype)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if bias is not None:
        scores = scores + bias
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]).to(v.dtype), v), lse


def _layer_class():
    global _SharedPromptLayer
    if _SharedPromptLayer is not None:
        return _SharedPromptLayer

    class SharedPromptLayer(growing_layer_class()):
        """A growing cache of the rows' generated positions (``keys``/``values``, B rows) plus the
        prompts' keys and values (G rows) and each row's group and slot in it."""

        def set_groups(self, row_group: torch.Tensor) -> None:
            """Rows' groups (B,); keeps only the prompts some row still samples from."""
            live, row_group = torch.unique(row_group, return_inverse=True)
            if live.numel() < self.prompt_keys.shape[0]:
                self.prompt_keys, self.prompt_values = self.prompt_keys[live], self.prompt_values[live]
                self.prompt_bias = self.prompt_bias[live]
            order = torch.argsort(row_group, stable=True)
            counts = torch.bincount(row_group, minlength=live.numel())
            starts = torch.cumsum(counts, 0) - counts
            slot = torch.empty_like(row_group)
            slot[order] = torch.arange(row_group.numel(), device=row_group.device) - starts[row_group[order]]
            self.row_group, self.row_slot, self.slots = row_group, slot, int(counts.max())
            self.in_order = bool((counts == self.slots).all()) and torch.equal(
                row_group, torch.arange(live.numel(), device=row_group.device).repeat_interleave(self.slots))

        def update(self, key_states, value_states, *args, **kwargs):
            return super().update(key_states.to(self.kv_dtype), value_states.to(self.kv_dtype), *args, **kwargs)

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized and self.keys.numel():
                super().batch_select_indices(indices)
            self.set_groups(self.row_group[indices])

        def get_seq_length(self) -> int:
            return self.prompt_keys.shape[-2] + (self.keys.shape[-2] if self.is_initialized and self.keys.numel() else 0)

    _SharedPromptLayer = SharedPromptLayer
    return SharedPromptLayer


_SharedPromptLayer = None
