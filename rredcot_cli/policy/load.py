"""Loading the policy: the model, its tokenizer and the backend that samples from it (HF or vLLM),
and the one prompt format and tokenisation both sampling and training use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rredcot_cli.errors import RredcotError
from rredcot_cli.policy.models import load_model_and_tokenizer, resolve_model_path
from rredcot_cli.policy.hf import HFBackend
from rredcot_cli.policy.vllm import VLLMBackend

if TYPE_CHECKING:
    from rredcot_cli.config.schema import BackendConfig, ModelConfig


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass
class Policy:
    """The model being sampled/trained, its tokenizer and the backend that generates from it."""

    model: Any
    tokenizer: Any
    backend: Any
    device: str
    chat_template: bool


KV_CACHE_DTYPES = ("auto", "bfloat16", "float16")


def load_policy(model: ModelConfig, backend: BackendConfig, seed: int) -> Policy:
    """Load the HF-format model of the ``model.*`` settings (the embedded tiny one, a hub id or a
    local checkpoint) and the generation backend of the ``backend.*`` settings. With
    ``backend.name="vllm"`` the HF model is still loaded: it is the copy that gets trained and
    scored, and its weights are pushed to vLLM after every update. ``seed`` seeds vLLM's sampler."""
    if backend.name not in ("hf", "vllm"):
        raise RredcotError(f"unknown backend {backend.name!r}; valid: hf, vllm")
    if backend.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise RredcotError(f"backend.kv_cache_dtype={backend.kv_cache_dtype}: unknown; valid: {', '.join(KV_CACHE_DTYPES)}")
    if backend.name != "hf" and backend.kv_cache_dtype != "auto":
        raise RredcotError(f"backend.kv_cache_dtype={backend.kv_cache_dtype} is an option of backend=hf; drop it with "
                           f"backend={backend.name}")
    if backend.name == "hf" and backend.batch_size < 1:
        raise RredcotError(f"backend.batch_size={backend.batch_size}: the hf backend needs at least 1 sequence per "
                           "generate call (0, all prompts in one call, is for backend=vllm)")
    device = resolve_device(backend.device)
    path = resolve_model_path(model.path)
    try:
        weights, tokenizer = load_model_and_tokenizer(path, dtype=model.dtype, device=device,
                                                      trust_remote_code=model.trust_remote_code)
    except OSError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise RredcotError(f"cannot load model.path={model.path}: {first_line} (pass a local HF model folder, "
                           f"a checkpoint such as runs/<run>/train/checkpoints/final, or a hub id)") from error
    chat_template = resolve_chat_template(tokenizer, model.chat_template, model.path)
    if backend.name == "hf":
        kv_dtype = None if backend.kv_cache_dtype == "auto" else getattr(torch, backend.kv_cache_dtype)
        engine = HFBackend(weights, tokenizer, batch_size=backend.batch_size, device=device, kv_dtype=kv_dtype)
    else:
        engine = VLLMBackend(
            str(path),
            tokenizer=tokenizer,
            dtype=model.dtype,
            device=device,
            gpu_memory_utilization=backend.gpu_memory_utilization,
            tensor_parallel_size=backend.tensor_parallel_size,
            enforce_eager=backend.enforce_eager,
            seed=seed,
            trust_remote_code=model.trust_remote_code,
            kv_cache_gb=backend.kv_cache_gb,
            max_model_len=backend.max_model_len,
            sleep_mode=backend.sleep_mode,
            sync_check_atol=backend.sync_check_atol,
        )
    return Policy(model=weights, tokenizer=tokenizer, backend=engine, device=device, chat_template=chat_template)


CHAT_TEMPLATE_CHOICES = ("auto", True, False)


def resolve_chat_template(tokenizer: Any, chat_template: Any, model_path: str) -> bool:
    """``model.chat_template``: ``auto`` (the default) is on exactly when the tokenizer has a chat
    template, so an instruct model gets the prompt format it was tuned on and a base model or the
    embedded one plain text; ``true`` on a tokenizer without one is refused in one line."""
    if isinstance(chat_template, str) and chat_template.lower() in ("true", "false"):
        chat_template = chat_template.lower() == "true"
    if chat_template not in CHAT_TEMPLATE_CHOICES:
        raise RredcotError(f"model.chat_template={chat_template}: unknown; valid: auto, true, false")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if chat_template == "auto":
        return has_template
    if chat_template and not has_template:
        raise RredcotError(f"model.chat_template=true, but the tokenizer of model.path={model_path} has no chat "
                           "template; use model.chat_template=auto or false (plain-text prompts)")
    return bool(chat_template)


def format_prompt(tokenizer: Any, text: str, chat_template: bool) -> str:
    """The benchmark's prompt, wrapped in the model's chat template for instruct models."""
    if not chat_template:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer: Any, text: str, chat_template: bool) -> list[int]:
    """The prompt's token ids, the one tokenisation both sampling and training use.

    A chat template already writes the model's special tokens (BOS included) into the text, so
    its output is tokenised without adding them again; a plain prompt gets the tokenizer's own
    special tokens (e.g. a BOS for Llama-style tokenizers), as ``tokenizer(text)`` gives them."""
    return list(tokenizer(text, add_special_tokens=not chat_template)["input_ids"])
