"""The policy's weights as a plain Hugging Face checkpoint would name them, for whoever needs a
copy outside the trainer: a vLLM engine after every update, or an exported checkpoint folder.

The trained module may be wrapped (DistributedDataParallel's ``.module``) or carry LoRA adapters
(peft); ``hf_weights`` hides both, so a consumer sees ``model.layers.0.self_attn.q_proj.weight``
and friends with the adapters merged in.
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


@contextmanager
def hf_weights(model: torch.nn.Module) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``(name, tensor)`` pairs of the policy under its plain HF names, valid inside the block.

    Tensors are detached views of the live parameters (no copy): read them inside the block."""
    model = unwrap(model)
    with torch.no_grad():
        yield [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
