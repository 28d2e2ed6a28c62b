"""Atomic writes: a file or folder appears whole under its name or not at all.

Every artifact, manifest, checkpoint and converted model is written into a temporary sibling
(``.tmp-...``), fsynced and renamed into place; a folder that replaces an older one first moves
the old one aside (``.old-...``), and ``remove_stale_temporaries`` cleans what a killed writer
left. A write that fails (a full disk, no permission) raises ``StorageError`` naming the path.
Only the standard library: everything that writes can import this module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from rredcot_cli.errors import EDQUOT, ENOSPC, ArtifactError, StorageError, full_disk_errno, human_bytes, storage_error


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


# Name parts of the temporaries atomic_path leaves behind only when its process is killed.
TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the ``<name>.tmp-*`` / ``<name>.old-*`` leftovers of writers killed mid-write.

    Called when a stage (re)starts in ``folder``, which then belongs to it. A leftover
    ``<name>.old-*`` whose ``<name>`` is missing is the previous complete version of a folder
    whose replacement was interrupted between its two renames; it is moved back into place
    rather than deleted. Returns the paths removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for leftover in sorted(folder.rglob(f"*{OLD_MARK}*")):
        target = leftover.with_name(leftover.name.split(OLD_MARK, 1)[0])
        if not target.exists():
            os.replace(leftover, target)
        elif leftover.exists():
            _remove(leftover)
            removed.append(leftover)
    for leftover in sorted(folder.rglob(f"*{TMP_MARK}*")):
        if leftover.exists():
            _remove(leftover)
            removed.append(leftover)
    return removed


def _bytes_in(path: Path) -> int:
    """Bytes a file or folder tree holds (0 when gone)."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size if path.exists() else 0
    except OSError:
        return 0


def _free_bytes(folder: Path) -> int | None:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


# A writer that fails with less than this free on its file system (and says nothing clearer) is
# taken to have failed for want of space: torch.save reports a full disk as "unexpected pos".
_NEARLY_FULL = 1 << 20


def _storage_failure(error: BaseException, path: Path, tmp: Path, needed: int | None):
    """``(errno, needed)`` when ``error``, raised while writing ``tmp`` for ``path``, is the
    machine's doing (a full disk, no permission...): its errno (None: an ``OSError`` without a
    hint) and, for a full disk, the bytes the write needs as text; None for anything else (a bug
    keeps its traceback). Measured before the temporary is removed: what it held is a lower bound
    of what the write needed."""
    errno = full_disk_errno(error)
    if errno is None and not isinstance(error, OSError):
        free = _free_bytes(path.parent)
        if free is None or free >= max(_NEARLY_FULL, needed or 0) or not isinstance(error, RuntimeError):
            return None
        errno = ENOSPC  # torch.save's "unexpected pos" / "file write failed" on a full disk
    if errno not in (ENOSPC, EDQUOT):
        return errno, None
    written = _bytes_in(tmp)
    return errno, (f"about {human_bytes(needed)}" if needed else f"at least {human_bytes(written)}" if written else None)


@contextlib.contextmanager
def atomic_path(path: str | Path, needed: int | None = None, hidden: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move what was written there into place.

    For writers that need a path (``pq.write_table``, ``model.save_pretrained``). The writer
    creates a file or a folder at the yielded path (``<name>.tmp-xxxx`` in the same folder).
    On success it is fsync'ed and renamed onto ``path`` (``os.replace`` for files; for folders
    the old folder is moved aside first and deleted after). On an exception the temporary is
    removed and ``path`` is left as it was; a full disk, no permission and the like (also when a
    library says so in its own exception, as safetensors and torch.save do) become a one-line
    ``StorageError`` naming ``path``, with ``needed`` (bytes the write takes, when the caller knows)
    and the space left. ``hidden``: the temporary's name starts with a dot, for a file written into a
    folder that readers list (a Parquet dataset reader skips dot files; it would read a finished
    temporary as one more part, its rows twice).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{'.' if hidden else ''}{path.name}{TMP_MARK}", dir=path.parent)
        os.close(fd)
    except StorageError:
        raise
    except OSError as e:
        raise storage_error(e, path, writing=True, free=_free_bytes(path.parent) if full_disk_errno(e) else None) from e
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
                old = path.with_name(f"{path.name}{OLD_MARK}{tmp.name.rsplit('-', 1)[-1]}")
                os.replace(path, old)
            os.replace(tmp, path)
            if old is not None:
                _remove(old)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as e:
        # Disk full, no permission...: name the file the user asked for, not the temporary.
        failure = (_storage_failure(e, path, tmp, needed)
                   if isinstance(e, Exception) and not isinstance(e, StorageError) else None)
        _remove(tmp)
        if failure is None:
            raise
        errno, wanted = failure
        free = _free_bytes(path.parent) if errno in (ENOSPC, EDQUOT) else None  # once the temporary is gone
        raise storage_error(e, path, writing=True, needed=wanted, free=free, errno=errno) from e


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    with atomic_path(path, needed=len(data)) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))
