"""One writer per stage folder: an advisory lock that a dead process never leaves stuck.

Every stage that writes (``runs.begin_stage``) takes ``<stage folder>/.rredcot.lock`` with
``fcntl.flock`` before it reads the folder's manifest, and holds it until the process exits; the
two views without a manifest (``heatmap``, ``report``) take the same lock on their output folder
before they write into it (``lock_output_folder``), so two of them never mix their files. The
kernel drops a ``flock`` when its process dies (SIGKILL, OOM, a lost node's process ended), so a
killed run's lock never needs cleaning: the file may stay, the lock does not. A second live process
is refused in one line naming the folder and the holder (its pid, host and command, which the
holder writes into the lock file).

Where the file system has no ``flock`` (some network mounts answer ENOLCK or EOPNOTSUPP) the stage
runs unlocked, as it did before, and says so once. Only the standard library.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from rredcot_cli.errors import RunError, StorageError, os_error_message

LOCK_FILE = ".rredcot.lock"

# Lock files this process holds, by resolved folder: the open file keeps the lock (a second open
# of the same file in this process would conflict with it, flock being per open file).
_HELD: dict[Path, int] = {}


def holder(folder: Path) -> dict:
    """What the process holding (or last holding) ``folder``'s lock wrote: pid, host, command,
    since; ``{}`` when unreadable."""
    try:
        found = json.loads((Path(folder) / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


# How a refused stage writes beside the holder; ``report`` names its own option instead.
BESIDE_STAGE = "pass run.tag=NAME (or another run.dir)"


def lock_stage_folder(folder: str | Path, beside: str = BESIDE_STAGE) -> bool:
    """Take ``folder``'s writer lock for the rest of this process (the folder must exist).

    Returns True when locked (or already held by this process), False where the file system has no
    ``flock``. Raises ``RunError`` (one line: the folder, the holder's pid, host and command, and
    ``beside``: how to write elsewhere) when another live process holds it.
    """
    import fcntl  # deferred: POSIX only, so importing the store stays portable

    folder = Path(folder)
    key = folder.resolve()
    if key in _HELD:
        return True
    path = folder / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StorageError(os_error_message(e, path, writing=True)) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunError(_refusal(folder, holder(folder), beside)) from None
        print(f"{folder}: the file system has no flock ({e.strerror}); running without the one-writer lock",
              file=sys.stderr)
        return False
    command = " ".join(["rredcot", *sys.argv[1:]])[:300]
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:
        pass  # the lock holds without the note (a full disk must not stop the stage here)
    _HELD[key] = fd
    return True


def lock_output_folder(folder: str | Path, beside: str = BESIDE_STAGE) -> Path:
    """Create ``folder`` (a view's output folder, which has no manifest) and take its writer lock,
    as ``lock_stage_folder``; returns the folder."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StorageError(os_error_message(e, folder, writing=True)) from e
    lock_stage_folder(folder, beside)
    return folder


def release(folder: str | Path) -> None:
    """Drop this process's lock on ``folder`` (the process's exit does it too)."""
    fd = _HELD.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor releases the flock


def _refusal(folder: Path, found: dict, beside: str) -> str:
    who = f"pid {found.get('pid', '?')} on {found.get('host', '?')}"
    if found.get("command"):
        who += f", `{found['command']}`"
    if found.get("since"):
        who += f", since {found['since']}"
    return (f"{folder} is being written by another rredcot process ({who}); wait for it to finish or stop it, "
            f"or {beside} to write beside it")
