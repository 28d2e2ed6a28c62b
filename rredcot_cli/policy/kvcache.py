"""A KV cache that does not copy itself per token: the HF backend decodes with it, and the probe
scorer (values/packing.py) hands probes their prefixes' keys and values in it.

transformers' ``DynamicLayer`` concatenates the whole cache with every new token, so a sequence
costs O(length^2) in copies: 30% of a default-length generate call on CPU and the reason decoding
collapsed at ~1,000 tokens (docs/studies/throughput.md). A static cache avoids the copies but attends over
its whole preallocated length from the first token. Here each full-attention layer writes new
keys and values into storage grown by doubling (up to a known maximum) and hands attention a view
of the filled part: the same numbers, stored once. Other layer kinds (sliding windows, ...) keep
transformers' own class. transformers is imported only when a cache is made: a transformers whose
``cache_utils`` has no layered cache (``DynamicLayer``) then costs the fast cache (``growing_cache``
returns None), not the import of this module (version fallback).
"""

from __future__ import annotations

import inspect


def _layer_class():
    """The layer class (made on first use, so that importing this module imports no transformers)."""
    global _GrowingLayer
    if _GrowingLayer is not None:
        return _GrowingLayer
    from transformers.cache_utils import DynamicLayer  # deferred: version fallback (see the module docstring)

    class GrowingLayer(DynamicLayer):
        """Keys and values in storage ``_store`` (grown by doubling up to ``_limit`` positions);
        ``keys``/``values`` are views of its filled part."""

        _limit = 0

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            store = getattr(self, "_store", None)
            filled = self.keys.shape[-2] if self.keys.numel() else 0
            if store is not None and (self.keys.data_ptr() != store[0].data_ptr() or filled > store[0].shape[-2]):
                store = None  # the cache was cropped or re-indexed from outside: start over from its view
            needed = filled + key_states.shape[-2]
            if store is None or needed > store[0].shape[-2]:
                capacity = min(max(2 * needed, 64), max(self._limit, needed))
                grown = []
                for old, new in ((self.keys, key_states), (self.values, value_states)):
                    buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
                    if filled:
                        buffer[..., :filled, :] = old
                    grown.append(buffer)
                store = self._store = tuple(grown)
            store[0][..., filled:needed, :] = key_states
            store[1][..., filled:needed, :] = value_states
            self.keys, self.values = store[0][..., :needed, :], store[1][..., :needed, :]
            return self.keys, self.values

    _GrowingLayer = GrowingLayer
    return GrowingLayer


_GrowingLayer = None


def growing_cache(model, max_length: int):
    """A cache for ``model.generate`` (or a forward with ``use_cache``) whose full-attention layers
    hold up to ``max_length`` positions without copying the cache per token. Returns None where
    the installed transformers has no layered cache (callers then use its default)."""
    try:
        # deferred: version fallback (see the module docstring)
        from transformers.cache_utils import DynamicCache, DynamicLayer

        layer_class = _layer_class()
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - an older transformers, or a config it cannot lay out
        return None
    if not cache.layers:
        return None
    layers = []
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer = layer_class()
            layer._limit = max_length
        layers.append(layer)
    cache.layers = layers
    return cache


def prefilled_cache(storage: list[tuple], filled: int):
    """A cache whose layer i starts with ``storage[i]`` = (keys, values) of shape (batch, kv heads,
    capacity, head dim), positions ``[:filled]`` valid: a forward appends its new positions in place
    (up to the capacity) instead of concatenating, and attends over the filled part."""
    from transformers.cache_utils import DynamicCache  # deferred: version fallback (see the module docstring)

    layer_class = _layer_class()
    cache = DynamicCache()
    cache.layers = []
    for keys, values in storage:
        layer = layer_class()
        layer.device, layer.is_initialized = keys.device, True
        layer._store, layer._limit = (keys, values), keys.shape[-2]
        layer.keys, layer.values = keys[..., :filled, :], values[..., :filled, :]
        cache.layers.append(layer)
    cache.layer_class_to_replicate = None
    return cache


def cache_kwarg(model, cache) -> dict:
    """transformers renamed generate's/forward's ``past_key_values`` to ``cache`` (5.2x): the
    keyword argument under the name the installed version takes."""
    return {"cache": cache} if "cache" in inspect.signature(model.forward).parameters else {"past_key_values": cache}
