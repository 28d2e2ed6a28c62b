"""User-facing errors of rredcot.

Every error a user can fix (a bad option, a missing artifact, a run folder made with other
options) is a ``RredcotError`` whose message is ONE line saying what is wrong and what to do.
The CLI prints it as ``error: <message>`` and exits with status 2, without a traceback; any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class RredcotError(Exception):
    """Base of the errors the CLI reports as one line (exit status 2)."""


class ArtifactError(RredcotError):
    """An input artifact is missing, unreadable, or does not have the expected schema."""


class RunError(RredcotError):
    """A stage cannot run in the chosen run folder (e.g. it holds outputs of other options)."""


class StorageError(RredcotError, OSError):
    """A file could not be written (disk full, no permission, read-only file system).

    Raised instead of the bare ``OSError`` so the user sees which path failed and what to do;
    every write is atomic, so outputs finished before the failure are intact. Also an
    ``OSError``, so code that handles I/O failures keeps catching it.
    """


class ConfigError(RredcotError):
    """The command line does not describe a valid config (rredcot_cli/config/); the message is one line."""


class TrainingError(RredcotError):
    """Training cannot go on (e.g. too many non-finite updates in a row)."""


def one_line(message: object) -> str:
    """``message`` as a single line: internal newlines and runs of spaces become one space."""
    return " ".join(str(message).split())


_OS_ERROR_HINTS = {
    28: "the disk is full; free space or point run.dir at another disk",  # ENOSPC
    122: "the disk quota is exceeded; free space or point run.dir elsewhere",  # EDQUOT
    13: "no permission; choose a writable run.dir",  # EACCES
    1: "no permission; choose a writable run.dir",  # EPERM
    30: "the file system is read-only; choose a writable run.dir",  # EROFS
}


def os_error_message(exc: OSError, path: object = None, writing: bool | None = None) -> str:
    """One line for an ``OSError`` met on ``path`` (default: the error's own filename).

    Names the path, the system's reason, and for the common causes (full disk, no permission,
    read-only file system) what to do. ``writing`` says "cannot write" (None: only for the
    errors that come from writing).
    """
    where = path if path is not None else (exc.filename or "a file")
    reason = exc.strerror or one_line(exc) or type(exc).__name__
    hint = _OS_ERROR_HINTS.get(exc.errno or -1)
    if writing is None:
        writing = hint is not None
    message = f"cannot write {where}: {reason}" if writing else f"{where}: {reason}"
    if hint:
        message += f" ({hint}); outputs finished before this were kept"
    return one_line(message)
