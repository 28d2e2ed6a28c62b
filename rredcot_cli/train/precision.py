"""Training precision: which dtype the trained weights live in, which dtype the forward passes
compute in, and how a backward pass becomes an optimizer step.

``train.precision``:

=============  =================  ==========  ===============================================
name           weights + AdamW    forward     notes
=============  =================  ==========  ===============================================
fp32           float32            float32     the embedded default
bf16-mixed     float32 (master)   bfloat16    autocast; what real models train with
fp16-mixed     float32 (master)   float16     autocast + dynamic loss scaling (GradScaler)
bf16-true      bfloat16           bfloat16    half the weight memory, but AdamW steps below
                                              bf16's resolution (~1e-3 relative) are lost:
                                              at lr 1e-6 most weights never move
auto           from ``model.dtype``: float32 -> fp32, bfloat16 -> bf16-mixed,
               float16 -> fp16-mixed
=============  =================  ==========  ===============================================

Mixed precision follows torch's AMP recipe (as Lightning's "bf16-mixed" and accelerate's
``mixed_precision``): parameters, gradients and optimizer state stay float32; matmuls run in
the low dtype under ``torch.autocast``; log-softmax and the loss are float32
(``rredcot_cli.policy.logprobs`` upcasts the logits). fp16's narrow exponent range needs loss scaling:
a step whose scaled gradient overflowed is skipped and the scale halved, as GradScaler does;
those skips are counted apart from genuinely non-finite steps so they never stop a run.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ContextManager

import torch

from rredcot_cli.config.schema import TrainConfig, choices

PRECISIONS = choices(TrainConfig, "precision")  # auto, fp32, bf16-mixed, fp16-mixed, bf16-true
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str
    param_dtype: torch.dtype  # the trained weights, their gradients and AdamW's moments
    compute_dtype: torch.dtype | None  # autocast dtype of forward passes; None: the weights' own

    @property
    def loss_scaling(self) -> bool:
        return self.compute_dtype == torch.float16

    def autocast(self, device: str | torch.device) -> ContextManager:
        """The context forward passes of the trained model run in."""
        if self.compute_dtype is None:
            return nullcontext()
        device_type = torch.device(device).type
        # No weight cache: with it, autocast keeps a low-precision copy of every weight alive for
        # the whole forward (2 bytes per parameter, docs/studies/memory.md finding 3), and each weight is
        # used once per forward anyway, so the cache saves no casts.
        return torch.autocast(device_type=device_type, dtype=self.compute_dtype, cache_enabled=False)


def resolve_precision(name: str, model_dtype: str) -> Precision:
    """The ``Precision`` of ``train.precision=name`` for a model configured as ``model.dtype``."""
    if name not in PRECISIONS:
        raise ValueError(f"train.precision={name}: unknown; valid: {', '.join(PRECISIONS)}")
    if model_dtype not in _DTYPES and model_dtype != "auto":
        raise ValueError(f"model.dtype={model_dtype}: unknown; valid: float32, bfloat16, float16")
    if name == "auto":
        name = {torch.float32: "fp32", torch.bfloat16: "bf16-mixed", torch.float16: "fp16-mixed"}[
            _DTYPES.get(model_dtype, torch.float32)]
    if name == "fp32":
        return Precision(name, torch.float32, None)
    if name == "bf16-mixed":
        return Precision(name, torch.float32, torch.bfloat16)
    if name == "fp16-mixed":
        return Precision(name, torch.float32, torch.float16)
    return Precision(name, torch.bfloat16, None)  # bf16-true


@dataclass
class StepResult:
    grad_norm: float
    stepped: bool
    overflow: bool  # fp16 loss scaling found inf/NaN gradients: skipped, scale lowered (not a divergence)


@dataclass
class GradientStepper:
    """``backward`` for each micro-batch, then ``step`` once per optimizer step: unscale (fp16),
    clip the gradient norm, and take the step only when the gradient is finite."""

    precision: Precision
    device: str | torch.device = "cpu"
    scaler: Any = field(default=None, init=False)

    def __post_init__(self):
        if self.precision.loss_scaling:
            self.scaler = torch.amp.GradScaler(torch.device(self.device).type)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter],
             grad_clip: float) -> StepResult:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        max_norm = grad_clip if grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
        finite = grad_norm == grad_norm and grad_norm not in (float("inf"), float("-inf"))
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skips the step by itself when the unscaled grads hold inf/NaN
            self.scaler.update()
            return StepResult(grad_norm, stepped=finite, overflow=not finite)
        if finite:
            optimizer.step()
        return StepResult(grad_norm, stepped=finite, overflow=False)

    def state_dict(self) -> dict | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def make_optimizer(model: torch.nn.Module, *, lr: float, betas: tuple[float, float], weight_decay: float,
                   device: str | torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable weights. On CUDA the fused kernel: the default multi-tensor one
    copies every second moment during the step (+4 bytes per parameter at the peak, 28 GiB for a
    7B model; docs/studies/memory.md finding 2). On CPU the default, whose numbers the embedded runs and
    their documented results were made with."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, **({"fused": True} if fused else {}))


def dtype_of(name: str) -> torch.dtype:
    """torch dtype of a ``model.dtype`` string (float32, bfloat16, float16 and short forms)."""
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]
