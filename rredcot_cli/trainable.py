"""The policy as the train stage trains it: weights in the training precision, gradient
checkpointing, the frozen reference, and the exported checkpoint. One small module so the train
loop reads as a recipe and each of these concerns lives in one place.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from rredcot_cli.precision import Precision
from rredcot_cli.weights import hf_weights, unwrap


def prepare(model: torch.nn.Module, precision: Precision, *, gradient_checkpointing: bool) -> torch.nn.Module:
    """``model`` with its weights in ``precision.param_dtype`` (float32 master weights under mixed
    precision: a bf16 checkpoint is upcast exactly) and, if asked, gradient checkpointing of
    its decoder layers (non-reentrant, as TRL's default: activations of a layer are recomputed in
    backward instead of kept, trading ~30% more compute for most of the activation memory)."""
    model.to(precision.param_dtype)
    if gradient_checkpointing:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"train.gradient_checkpointing=true: {type(model).__name__} does not support it")
        # transformers >= 5.20 renamed it "activation checkpointing"; older releases have the old name.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether any layer of ``model`` recomputes its activations in backward."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def reference(model: torch.nn.Module, precision: Precision) -> torch.nn.Module:
    """The frozen initial policy for the KL term: a deep copy held in the compute dtype (bf16
    under bf16-mixed: it is never trained, so it needs no float32 master weights)."""
    frozen = copy.deepcopy(unwrap(model)).eval()
    frozen.to(precision.compute_dtype or precision.param_dtype)
    for module in frozen.modules():  # never trained: nothing to recompute
        if getattr(module, "gradient_checkpointing", False):
            module.gradient_checkpointing = False
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen


def export_checkpoint(model: torch.nn.Module, tokenizer, path: Path, dtype: torch.dtype) -> None:
    """Write a plain HF folder of the policy into ``path`` (an existing, empty folder), with the
    weights in ``dtype`` (the model's configured dtype, not the float32 master copy)."""
    base = unwrap(model)
    cast: dict[tuple, torch.Tensor] = {}  # by storage, so tied weights stay one tensor
    with hf_weights(model) as weights:
        state = {name: cast.setdefault((t.data_ptr(), tuple(t.shape)), t.to(dtype)) for name, t in weights}
    base.save_pretrained(path, state_dict=state)
    # save_pretrained writes the dtype of the live (float32 master) weights into config.json.
    config_file = Path(path) / "config.json"
    config = json.loads(config_file.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(path)
