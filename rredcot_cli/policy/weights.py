"""The policy's weights as a plain Hugging Face checkpoint would name them, for whoever needs a
copy outside the trainer: a vLLM engine after every update, or an exported checkpoint folder.

The trained module may be wrapped (DistributedDataParallel's ``.module``) or carry LoRA adapters
(peft); ``hf_weights`` hides both, so a consumer sees ``model.layers.0.self_attn.q_proj.weight``
and friends with the adapters merged in.

Merging is out of place: each adapted weight is yielded as ``W + scale * B @ A`` computed in
float32 and cast back, one layer at a time, and the live weights are never touched. (peft's
``merge_adapter``/``unmerge_adapter`` add and subtract in place; in a bf16 base that round trip
is not exact, and repeated before every sync the rounding would drift the frozen weights.)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DistributedDataParallel-style wrapper (``.module``), else ``model``."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def is_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a peft model (LoRA adapters on a frozen base)."""
    return hasattr(unwrap(model), "peft_config") and hasattr(unwrap(model), "get_base_model")


@contextmanager
def hf_weights(model: torch.nn.Module) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """``(name, tensor)`` pairs of the policy under its plain HF names, adapters merged; iterate
    them inside the block, once. Unadapted tensors are detached views of the live weights (no
    copy); merged ones are produced a layer at a time."""
    model = unwrap(model)
    with torch.no_grad():
        if is_lora(model):
            yield _merged_lora_weights(model)
        else:
            yield ((name, tensor.detach()) for name, tensor in model.state_dict().items())


def _merged_lora_weights(peft_model) -> Iterator[tuple[str, torch.Tensor]]:
    from peft.tuners.lora import LoraLayer  # optional dependency: peft (the lora extra)

    base = peft_model.get_base_model()
    adapter = peft_model.active_adapter
    layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:  # lora_A / lora_B / dropout state: folded into the base weight below
            continue
        module_name, _, leaf = name.rpartition(".")
        if not module_name.endswith(".base_layer"):
            yield name, tensor.detach()
            continue
        owner = module_name[: -len(".base_layer")]
        if leaf == "weight" and adapter in getattr(layers[owner], "lora_A", {}):
            delta = layers[owner].get_delta_weight(adapter).float()
            yield f"{owner}.weight", (tensor.float() + delta).to(tensor.dtype)
        else:
            yield f"{owner}.{leaf}", tensor.detach()
