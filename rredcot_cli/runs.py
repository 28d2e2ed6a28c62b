"""Run folders, manifests, seeds and atomic writes.

Layout of a run folder (``run.dir``, default ``runs/<YYYYmmdd-HHMMSS>``)::

    <run.dir>/
      sample[-<tag>]/               samples.parquet
      segment[-<tag>]/              segments.parquet
      attribute[-<tag>]/<method>/   credits.parquet, advantages.parquet
      train[-<tag>]/                metrics.parquet, eval.parquet, summary.json, checkpoints/
      eval[-<tag>]/                 eval.parquet
      sft[-<tag>]/                  the SFT'd tiny model

Every stage folder also holds ``config.yaml`` (the resolved config), ``overrides.yaml`` (the CLI
overrides) and ``manifest.json`` (status, config hash, git sha, versions, seed, input hashes,
output hashes). A stage whose folder already holds a complete manifest with the same hash is
skipped; one made with other options is refused unless ``run.overwrite=true`` or a
``run.tag`` puts the new outputs beside the old ones.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from rredcot_cli.errors import ArtifactError, RunError

if TYPE_CHECKING:
    from omegaconf import DictConfig

MANIFEST = "manifest.json"
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
_VERSIONED_PACKAGES = ("rredcot", "torch", "transformers", "vllm")


# --------------------------------------------------------------------------- seeds


def derive_seed(seed: int, *keys: str | int) -> int:
    """A 31-bit seed derived from ``seed`` and ``keys``, stable across processes and machines.

    ``derive_seed(cfg.seed, "sample", prompt_id, k)``: different keys give independent seeds;
    the string "1" and the int 1 are different keys.
    """
    payload = json.dumps([int(seed), *keys], separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") & 0x7FFFFFFF


# --------------------------------------------------------------------------- atomic writes


def _fsync_dir(path: Path) -> None:
    """fsync a folder so a rename inside it survives a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """fsync a file, or every file of a folder tree."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        with open(file, "rb") as f:
            os.fsync(f.fileno())
    if path.is_dir():
        for folder in [path, *[p for p in path.rglob("*") if p.is_dir()]]:
            _fsync_dir(folder)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move what was written there into place.

    For writers that need a path (``pq.write_table``, ``model.save_pretrained``). The writer
    creates a file or a folder at the yielded path (``<name>.tmp-xxxx`` in the same folder).
    On success it is fsync'ed and renamed onto ``path`` (``os.replace`` for files; for folders
    the old folder is moved aside first and deleted after). On an exception the temporary is
    removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f"{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    tmp.unlink()  # the writer creates it (as a file or a folder)
    try:
        yield tmp
        if not tmp.exists():
            raise ArtifactError(f"nothing was written to {tmp} (meant for {path})")
        _fsync_tree(tmp)
        if tmp.is_dir():
            old = None
            if path.exists():
                old = path.with_name(f"{path.name}.old-{tmp.name.rsplit('-', 1)[-1]}")
                os.replace(path, old)
            os.replace(tmp, path)
            if old is not None:
                _remove(old)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        _remove(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


# --------------------------------------------------------------------------- hashing


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, or of a folder (its relative file paths and file contents, sorted)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(file.relative_to(path).as_posix().encode() + b"\0")
            h.update(sha256_file(file).encode())
        return h.hexdigest()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --------------------------------------------------------------------------- provenance


def _git_state() -> dict[str, Any]:
    """sha and dirty flag of the git checkout holding this package's source (nulls otherwise)."""
    package_dir = Path(__file__).resolve().parent
    state: dict[str, Any] = {"sha": None, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(package_dir), *args],
                capture_output=True, text=True, timeout=10, check=True,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    top = git("rev-parse", "--show-toplevel")
    # Only trust the repository whose root holds this package (not, say, one around a venv).
    if not top or Path(top).resolve() != package_dir.parent:
        return state
    state["sha"] = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    state["dirty"] = None if status is None else bool(status)
    return state


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    if versions["rredcot"] is None:  # running from a source checkout that is not pip-installed
        from rredcot_cli import __version__

        versions["rredcot"] = __version__
    return versions


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "unreadable"}


def _write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=False) + "\n")


# --------------------------------------------------------------------------- stages


def stage_folder(cfg: DictConfig, stage: str, subdir: str | None = None) -> Path:
    """``<run.dir>/<stage>`` or ``<run.dir>/<stage>-<run.tag>``, plus ``/<subdir>`` if given."""
    name = f"{stage}-{cfg.run.tag}" if cfg.run.tag else stage
    folder = Path(cfg.run.dir) / name
    return folder / subdir if subdir else folder


class StageOutput:
    """The output folder of a running stage; call ``finish`` once every output is written."""

    def __init__(self, folder: Path, manifest: dict[str, Any]) -> None:
        self.dir = folder
        self.manifest = manifest

    def path(self, name: str) -> Path:
        """``self.dir / name``."""
        return self.dir / name

    def finish(self, outputs: dict[str, Path], extra: dict[str, Any] | None = None) -> None:
        """Mark the stage complete: record each output (path, sha256) and ``extra`` in the manifest.

        ``outputs`` maps a name (e.g. "samples") to a file or folder the stage wrote; paths
        inside the stage folder are recorded relative to it.
        """
        recorded = {}
        for name, out in outputs.items():
            out = Path(out)
            if not out.exists():
                raise RunError(f"stage {self.manifest.get('stage')}: output {name} was not written ({out})")
            try:
                shown = out.resolve().relative_to(self.dir.resolve()).as_posix()
            except ValueError:
                shown = str(out)
            recorded[name] = {"path": shown, "sha256": sha256_file(out)}
        self.manifest.update(
            status="complete",
            finished=_now(),
            outputs=recorded,
            extra=dict(extra or {}),
        )
        _write_manifest(self.dir, self.manifest)


def _differing_keys(folder: Path, cfg: DictConfig, keys: list[str]) -> list[str] | None:
    """Top-level ``keys`` whose values differ between ``folder/config.yaml`` and ``cfg``."""
    from omegaconf import OmegaConf

    path = folder / CONFIG_FILE
    if not path.exists():
        return None
    try:
        old = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # noqa: BLE001 - an unreadable old config only loses the detail
        return None
    new = OmegaConf.to_container(cfg, resolve=True)
    return [k for k in sorted(keys) if old.get(k) != new.get(k)]


def begin_stage(
    cfg: DictConfig,
    stage: str,
    overrides: list[str],
    inputs: dict[str, Path],
    keys: list[str],
    subdir: str | None = None,
) -> StageOutput | None:
    """Prepare ``<run.dir>/<stage>[-<tag>][/<subdir>]`` for a stage, or say it is already done.

    The stage's hash covers ``config_hash(cfg, keys)`` and the sha256 of every input file.
    - complete manifest with the same hash (and not ``run.overwrite``): print a note, return None;
    - manifest with another hash (and not ``run.overwrite``): raise ``RunError``;
    - otherwise: create the folder, write ``config.yaml``, ``overrides.yaml`` and a manifest with
      status "running", and return a ``StageOutput``.
    """
    from omegaconf import OmegaConf

    from rredcot_cli.config import config_hash

    folder = stage_folder(cfg, stage, subdir)
    input_records = {}
    for name, path in inputs.items():
        path = Path(path)
        if not path.exists():
            raise ArtifactError(f"input {name} does not exist: {path}")
        input_records[name] = {"path": str(path), "sha256": sha256_file(path)}
    digest = hashlib.sha256()
    digest.update(config_hash(cfg, keys).encode())
    for name in sorted(input_records):
        digest.update(f"\0{name}\0{input_records[name]['sha256']}".encode())
    stage_hash = digest.hexdigest()[:12]

    old = _read_manifest(folder)
    if old is not None and not cfg.run.overwrite:
        if old.get("config_hash") == stage_hash:
            if old.get("status") == "complete":
                print(
                    f"{folder} is up to date (same config); skipping. "
                    "Pass run.overwrite=true to redo.",
                    file=sys.stderr,
                )
                return None
            # Same options, but the last attempt did not finish: run it again.
        elif old.get("status") != "complete":
            # An attempt that died holds nothing finished; replace it, but say so.
            print(f"{folder}: replacing an unfinished earlier attempt made with other options.", file=sys.stderr)
        else:
            differing = _differing_keys(folder, cfg, keys)
            old_inputs = {k: v.get("sha256") for k, v in (old.get("inputs") or {}).items()}
            new_inputs = {k: v["sha256"] for k, v in input_records.items()}
            what = list(differing or [])
            if old_inputs != new_inputs:
                what.append("inputs")
            detail = f" (differs in: {', '.join(what)})" if what else ""
            raise RunError(
                f"{folder} holds {stage} outputs made with other options{detail}; "
                "pass run.tag=NAME to keep both, or run.overwrite=true to replace them"
            )

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
    atomic_write_text(folder / OVERRIDES_FILE, OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
    manifest: dict[str, Any] = {
        "stage": stage,
        "status": "running",
        "created": _now(),
        "config_hash": stage_hash,
        "config_keys": sorted(keys),
        "git": _git_state(),
        "versions": _versions(),
        "seed": int(cfg.seed),
        "inputs": input_records,
        "hostname": socket.gethostname(),
        "command": list(sys.argv),
    }
    _write_manifest(folder, manifest)
    return StageOutput(folder, manifest)


def find_input(cfg: DictConfig, artifact: str) -> Path:
    """The path of input ``artifact`` (e.g. "samples") for the current stage.

    ``cfg.inputs.<artifact>`` when set; else the producing stage's folder in ``run.dir``:
    ``<run.dir>/<stage>-<run.tag>/`` if it exists, otherwise ``<run.dir>/<stage>/`` (so a tagged
    downstream variant reads the untagged upstream outputs). Credits and advantages live under
    ``attribute[-<tag>]/<method.name>/``. Raises ``ArtifactError`` saying how to make the file.
    """
    from rredcot_cli.artifacts import get_spec

    spec = get_spec(artifact)
    explicit = (cfg.get("inputs") or {}).get(artifact)
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise ArtifactError(f"inputs.{artifact}={explicit}: no such file")
        return path

    subdir = cfg.method.name if spec.made_by_stage == "attribute" else None
    candidates = [stage_folder(cfg, spec.made_by_stage, subdir) / spec.file_name]
    if cfg.run.tag:
        untagged = Path(cfg.run.dir) / spec.made_by_stage
        candidates.append((untagged / subdir if subdir else untagged) / spec.file_name)
    for path in candidates:
        if path.exists():
            return path
    where = candidates[0].parent
    command = f"rredcot {spec.made_by_stage} run.dir={cfg.run.dir}"
    if cfg.run.tag:
        command += f" run.tag={cfg.run.tag}"
    if subdir:
        command += f" method={subdir}"
    raise ArtifactError(
        f"no {spec.file_name} in {where}: run `{command}` first, "
        f"or pass inputs.{artifact}=PATH"
    )
