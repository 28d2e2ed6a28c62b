"""The tiny embedded model: a character-level tokenizer and a small Llama, both in plain HF format.

The embedded checkpoint loads through exactly the same code path as a real model
(``AutoModelForCausalLM`` / ``AutoTokenizer``), so every stage works unchanged on a hub model.

The architecture is Llama rather than Qwen2: transformers 5 ``AutoTokenizer`` forces
``Qwen2Tokenizer`` (byte-level BPE) on any folder whose config says ``model_type: qwen2``, which
would ignore the character-level ``tokenizer.json``. For ``llama`` it honours the tokenizer files.
The two architectures differ only in Qwen2's q/k/v biases.
This module imports torch and transformers: only stages import it, never ``rredcot_cli`` itself.
"""

from __future__ import annotations

import string
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from rredcot_cli.policy.model_files import resolve_source

EMBEDDED_MODEL = "embedded"
ASSETS_DIR = Path(__file__).parents[1] / "assets"  # rredcot_cli/assets
EMBEDDED_DIR = ASSETS_DIR / "tiny-chain"

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, UNK_TOKEN]  # ids 0, 1, 2

# Digits, letters, ASCII punctuation and whitespace: covers both synthetic tasks and short prose.
DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n\t"


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET, model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """A one-token-per-character tokenizer in standard HF format (tokenizer.json).

    Ids: ``<|pad|>`` = 0, ``<|endoftext|>`` = 1 (EOS), ``<|unk|>`` = 2, then one id per character of
    ``alphabet`` in order. Characters outside the alphabet map to ``<|unk|>``. No BOS is added.
    For any text over the alphabet, ``decode(encode(text, add_special_tokens=False)) == text``
    with one token per character, except that the literal strings of the special tokens (e.g.
    ``"<|endoftext|>"``) are parsed as those single tokens, as in every HF tokenizer.
    """
    chars = list(dict.fromkeys(alphabet))  # de-duplicate, keep order
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    # Every character (newlines included) is its own pre-token; decoding concatenates tokens.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


def build_tiny_model(
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 6,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_position_embeddings: int = 2048,
    *,
    pad_token_id: int = 0,
    eos_token_id: int = 1,
    bos_token_id: int | None = None,
) -> LlamaForCausalLM:
    """A randomly initialised Llama causal LM (about 1.6M parameters at the defaults), float32."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id if bos_token_id is None else bos_token_id,
        attention_bias=False,
        use_cache=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.bos_token_id = config.bos_token_id
    return model


def shipped_model_dir(name: str) -> Path | None:
    """The folder of a model shipped in ``rredcot_cli/assets`` named ``name`` (``tiny-chain``, also
    called ``embedded``, and ``tiny-chain-verbose``), or None for anything else. A shipped
    name wins over a folder of the same name in the working directory: write ``./NAME`` for that."""
    if name == EMBEDDED_MODEL:
        return EMBEDDED_DIR
    if not name or any(c in name for c in "/\\") or name.startswith("."):
        return None
    folder = ASSETS_DIR / name
    return folder if (folder / "config.json").is_file() else None


def resolve_model_path(path: str) -> str:
    """A shipped model's name (``embedded``, ``tiny-chain``) -> its folder in the package; a GGUF
    file or ``pkg://DIST/FILE.gguf`` -> its converted HF folder (``model_files``, converted on
    first use); anything else (a folder, a hub id) unchanged."""
    shipped = shipped_model_dir(path)
    if shipped is not None:
        return str(shipped)
    return resolve_source(path, on_progress=lambda message: print(message, file=sys.stderr, flush=True))


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(table)}")
    return table[dtype]


def load_model_and_tokenizer(
    path: str,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
):
    """Load any HF causal LM (``"embedded"`` included) in eval mode, plus its tokenizer.

    The tokenizer always has a pad token (falls back to EOS) and pads on the left, as batched
    generation needs. Returns ``(model, tokenizer)``.
    """
    resolved = resolve_model_path(path)
    tokenizer = AutoTokenizer.from_pretrained(resolved, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(
        resolved, dtype=_torch_dtype(dtype), trust_remote_code=trust_remote_code
    )
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.to(device)
    model.eval()
    return model, tokenizer


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
