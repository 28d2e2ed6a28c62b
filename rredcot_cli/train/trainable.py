"""The policy as the train stage trains it: weights in the training precision, LoRA adapters,
gradient checkpointing, the frozen reference, and its checkpoints. One small module so the
train loop reads as a recipe and each of these concerns lives in one place.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from rredcot_cli.train.precision import Precision
from rredcot_cli.policy.logprobs import ForwardPass
from rredcot_cli.policy.weights import hf_weights, is_lora, unwrap
from rredcot_cli.errors import RredcotError

ADAPTER_DIR = "adapter"  # the LoRA adapter beside a merged final checkpoint


@dataclass(frozen=True)
class LoraSettings:
    r: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]


def prepare(model: torch.nn.Module, precision: Precision, *, gradient_checkpointing: bool = False,
            lora: LoraSettings | None = None) -> torch.nn.Module:
    """The model to train.

    Without LoRA: every weight in ``precision.param_dtype`` (float32 master weights under mixed
    precision; a bf16 checkpoint upcasts exactly). With LoRA (``lora.r > 0``): peft adapters on
    every ``lora.target_modules`` layer, only they train and they are held in
    ``precision.param_dtype``; the frozen base stays in the compute dtype (it needs no master
    copy). ``gradient_checkpointing``: ``checkpoint_layers`` on the result."""
    if lora is not None and lora.r > 0:
        model = _with_lora(model, precision, lora)
    else:
        model.to(precision.param_dtype)
    if gradient_checkpointing:
        checkpoint_layers(model)
    return model


def supports_checkpointing(model: torch.nn.Module) -> bool:
    """Whether ``checkpoint_layers`` can run on ``model`` (a transformers model that supports it)."""
    inner = model.get_base_model() if is_lora(model) else model
    return bool(getattr(inner, "supports_gradient_checkpointing", False))


def checkpoint_layers(model: torch.nn.Module) -> None:
    """Gradient checkpointing (non-reentrant, TRL's default): each decoder layer's activations are
    recomputed in backward instead of kept, ~30% more compute for most of the activation memory;
    the same numbers (the same ops on the same inputs)."""
    inner = model.get_base_model() if is_lora(model) else model
    if not supports_checkpointing(model):
        raise ValueError(f"train.gradient_checkpointing=true: {type(inner).__name__} does not support it")
    # transformers >= 5.20 renamed it "activation checkpointing"; older releases have the old name.
    if hasattr(inner, "activation_checkpointing_enable"):
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _with_lora(model: torch.nn.Module, precision: Precision, lora: LoraSettings) -> torch.nn.Module:
    try:
        from peft import LoraConfig, get_peft_model  # optional dependency: peft (the lora extra)
    except ImportError as e:
        raise RredcotError("model.lora.r > 0 needs peft: pip install -e '.[lora]'") from e
    model.to(precision.compute_dtype or precision.param_dtype)
    targets = "all-linear" if list(lora.target_modules) == ["all-linear"] else list(lora.target_modules)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    for p in peft_model.parameters():
        if p.requires_grad:
            p.data = p.data.to(precision.param_dtype)
    return peft_model


def checkpointing_active(model: torch.nn.Module) -> bool:
    """Whether any layer of ``model`` recomputes its activations in backward."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def reference(model: torch.nn.Module, precision: Precision, forward: ForwardPass) -> tuple[torch.nn.Module, ForwardPass]:
    """The frozen initial policy for the KL term, and how to run it.

    With LoRA it is the policy itself with its adapters switched off (no copy). Otherwise a deep
    copy held in the compute dtype (bf16 under bf16-mixed: it is never trained, so it needs no
    float32 master weights)."""
    if is_lora(model):
        peft_model = unwrap(model)

        @contextmanager
        def adapters_off():
            with forward.autocast(), peft_model.disable_adapter():
                yield

        return model, dataclasses.replace(forward, autocast=adapters_off)
    frozen = copy.deepcopy(unwrap(model)).eval()
    frozen.to(precision.compute_dtype or precision.param_dtype)
    for module in frozen.modules():  # never trained: nothing to recompute
        if getattr(module, "gradient_checkpointing", False):
            module.gradient_checkpointing = False
    for p in frozen.parameters():
        p.requires_grad_(False)
    return frozen, forward


def save_trained_weights(model: torch.nn.Module, folder: Path) -> None:
    """The weights a resume needs, in the training precision: the whole model as an HF folder, or
    with LoRA the adapter only (peft's adapter_model.safetensors + adapter_config.json)."""
    unwrap(model).save_pretrained(folder)


def load_trained_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load what ``save_trained_weights`` wrote into ``model``; ValueError if it does not fit."""
    model = unwrap(model)
    if is_lora(model):
        from peft import set_peft_model_state_dict  # optional dependency: peft (the lora extra)

        file = folder / "adapter_model.safetensors"
        if not file.is_file():
            raise ValueError(f"no LoRA adapter ({file.name}) in {folder}")
        result = set_peft_model_state_dict(model, load_file(file))
        missing = [k for k in result.missing_keys if ".lora_" in k]
        if missing or result.unexpected_keys:
            raise ValueError(f"the adapter does not fit the model (missing {missing[:3]}, "
                             f"unexpected {result.unexpected_keys[:3]})")
        return
    weights = {}
    for file in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(file))
    device = next(model.parameters()).device
    result = model.load_state_dict({k: v.to(device) for k, v in weights.items()}, strict=False)
    # HF leaves tied parameters (lm_head sharing the embedding) out of a save: accept those only.
    groups: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), set()).add(name)
    tied_ok = {name for names in groups.values() if names & set(weights) for name in names}
    missing = [k for k in result.missing_keys if k not in tied_ok]
    if missing or result.unexpected_keys:
        raise ValueError(f"its weights do not fit the model (missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})")


def export_checkpoint(model: torch.nn.Module, tokenizer, path: Path, dtype: torch.dtype) -> None:
    """Write a plain HF folder of the policy into ``path`` (an existing, empty folder): weights in
    ``dtype`` (the model's configured dtype, not the float32 master copy), LoRA adapters merged,
    and with LoRA the adapter itself in ``path/adapter``."""
    model = unwrap(model)
    base = model.get_base_model() if is_lora(model) else model
    cast: dict[tuple, torch.Tensor] = {}  # by storage, so tied weights stay one tensor
    with hf_weights(model) as weights:
        state = {}
        for name, t in weights:
            key = (t.data_ptr(), tuple(t.shape))
            if key not in cast:
                cast[key] = t.to(dtype)
            state[name] = cast[key]
    base.save_pretrained(path, state_dict=state)
    # save_pretrained writes the dtype of the live (float32 master) weights into config.json.
    config_file = Path(path) / "config.json"
    config = json.loads(config_file.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(path)
    if is_lora(model):
        model.save_pretrained(Path(path) / ADAPTER_DIR)
