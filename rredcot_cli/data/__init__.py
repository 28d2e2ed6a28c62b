"""Packaged benchmark data and the reader for other copies of it.

``read_split(benchmark, split, path)`` yields the raw records (dicts) of one split, each with a
human-readable location (``file:line``) for error messages. ``path`` selects the source:

* ``None``: the copy packaged in this folder (``<benchmark>/<split>.jsonl``, see README.md);
* a local ``.jsonl`` / ``.json`` / ``.parquet`` file (used whatever the split is);
* a local folder holding ``<split>.jsonl``, ``<split>.json``, ``<split>.parquet`` or HF-style
  ``[data/]<split>-*.parquet`` shards;
* anything else: an HF hub dataset id, optionally ``<repo_id>:<config>``, loaded with
  ``datasets.load_dataset`` when ``datasets`` is installed, else by downloading the split's file
  with ``huggingface_hub``. (The hub path needs network access; it is not exercised by the tests.)

``datasets`` (not a dependency) is imported only when a hub dataset is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq
import huggingface_hub as hub

from rredcot_cli.errors import RredcotError, one_line

DATA_DIR = Path(__file__).parent
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")

Record = tuple[str, dict[str, Any]]  # (location for error messages, raw row)


def packaged_splits(benchmark: str) -> list[str]:
    """Names of the splits packaged for ``benchmark`` (e.g. ``["test", "train"]``)."""
    return sorted(p.stem for p in (DATA_DIR / benchmark).glob("*.jsonl"))


def read_split(benchmark: str, split: str, path: str | None = None, hub_config: str | None = None) -> Iterator[Record]:
    """Raw records of ``split``, in file order. See the module docstring for what ``path`` may be.

    ``hub_config`` is the dataset config used for a hub id given without ``:<config>``.
    Raises RredcotError (one line) for a missing split, an unreadable file or a malformed line.
    """
    if path is None:
        packaged = DATA_DIR / benchmark / f"{split}.jsonl"
        if not packaged.is_file():
            raise RredcotError(
                f"benchmark {benchmark} has no packaged split {split!r} "
                f"(packaged: {', '.join(packaged_splits(benchmark)) or 'none'}); set benchmark.path to a file or folder"
            )
        return _read_file(packaged)
    local = Path(path).expanduser()
    if local.is_file():
        return _read_file(local)
    if local.is_dir():
        return _read_file(_split_file_in_dir(local, split))
    if _looks_local(path):
        raise RredcotError(f"benchmark {benchmark}: {path} does not exist")
    try:
        return _read_hub(path, split, hub_config)
    except RredcotError:
        raise
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo...
        raise RredcotError(
            f"benchmark {benchmark}: {path!r} is not a local file or folder, and loading it as an HF hub "
            f"dataset failed ({type(exc).__name__}: {one_line(exc)[:300]})"
        ) from None


def _looks_local(path: str) -> bool:
    """A path that cannot be a hub id: absolute, relative with ./ ../ ~, or with a file suffix."""
    return path.startswith(("/", "./", "../", "~", "\\")) or path.endswith(LOCAL_SUFFIXES) or path.count("/") > 1


def _split_file_in_dir(folder: Path, split: str) -> Path:
    """The file of ``split`` in ``folder``; a sharded split must be a single shard here."""
    for suffix in LOCAL_SUFFIXES:
        candidate = folder / f"{split}{suffix}"
        if candidate.is_file():
            return candidate
    shards = sorted(folder.glob(f"{split}-*.parquet")) + sorted(folder.glob(f"data/{split}-*.parquet"))
    if len(shards) == 1:
        return shards[0]
    if len(shards) > 1:
        raise RredcotError(f"{folder} holds {len(shards)} parquet shards for split {split!r}; merge them into {split}.parquet")
    raise RredcotError(f"{folder} has no {split}.jsonl, {split}.json or {split}.parquet")


def _read_file(path: Path) -> Iterator[Record]:
    """Records of a local JSONL, JSON (an array of objects, or JSON lines) or Parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".json":
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise RredcotError(f"{path}: not UTF-8 text (byte {exc.start + 1})") from None
        if text.lstrip().startswith("["):
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RredcotError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
            return _check_objects(((f"{path} item {i}", row) for i, row in enumerate(rows)))
    return _read_jsonl(path)


def _read_jsonl(path: Path) -> Iterator[Record]:
    with open(path, "rb") as f:  # decoded line by line, so a bad byte is reported with its line
        for lineno, raw in enumerate(f, start=1):
            location = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RredcotError(f"{location}: not UTF-8 text (byte {exc.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RredcotError(f"{location}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise RredcotError(f"{location}: expected a JSON object, got {type(row).__name__}")
            yield location, row


def _check_objects(records: Iterator[Record]) -> Iterator[Record]:
    for location, row in records:
        if not isinstance(row, dict):
            raise RredcotError(f"{location}: expected a JSON object, got {type(row).__name__}")
        yield location, row


def _read_parquet(path: Path) -> Iterator[Record]:
    try:
        table = pq.read_table(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise RredcotError(f"{path}: cannot read Parquet ({' '.join(str(exc).split())})") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path} row {i}", row


def _read_hub(path: str, split: str, default_config: str | None) -> Iterator[Record]:
    """Records of ``split`` of the hub dataset ``repo_id[:config]`` (needs network access)."""
    repo_id, _, config = path.partition(":")
    config = config or default_config
    try:
        import datasets  # optional dependency: datasets, for hub datasets only
    except ImportError:
        datasets = None
    if datasets is not None:
        try:
            ds = datasets.load_dataset(repo_id, config, split=split)
        except ValueError as exc:
            if config is None or "config" not in str(exc).lower():
                raise
            ds = datasets.load_dataset(repo_id, split=split)  # the default config did not exist
        return ((f"{repo_id} {split} row {i}", dict(row)) for i, row in enumerate(ds))
    return _read_file(_download_hub_split(repo_id, split, config))


def _download_hub_split(repo_id: str, split: str, config: str | None) -> Path:
    """Download the file holding ``split`` of a hub dataset with huggingface_hub."""
    files = hub.list_repo_files(repo_id, repo_type="dataset")
    prefixes = [f"{config}/", "data/", ""] if config else ["data/", ""]
    for prefix in prefixes:
        for name in (f"{split}.jsonl", f"{split}.json", f"{split}.parquet"):
            if prefix + name in files:
                return Path(hub.hf_hub_download(repo_id, prefix + name, repo_type="dataset"))
        shards = sorted(f for f in files if f.startswith(f"{prefix}{split}-") and f.endswith(".parquet") and "/" not in f[len(prefix) :])
        if len(shards) == 1:
            return Path(hub.hf_hub_download(repo_id, shards[0], repo_type="dataset"))
        if len(shards) > 1:
            raise RredcotError(f"{repo_id}: split {split!r} has {len(shards)} shards; install `datasets` to load it")
    raise RredcotError(f"{repo_id}: no file for split {split!r} found on the hub (install `datasets` for other layouts)")
