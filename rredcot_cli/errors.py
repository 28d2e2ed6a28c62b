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
    ``OSError``, so code that handles I/O failures keeps catching it. ``problem`` is the message
    without its last clause, ``kept`` (what is left on disk); a stage that knows better what is
    kept says so with ``keeping`` (train: the last complete checkpoint).
    """

    def __init__(self, problem: str, kept: str | None = None, errno: int | None = None) -> None:
        super().__init__(f"{problem}; {kept}" if kept else problem)
        self.problem, self.kept, self.errno = problem, kept, errno

    def keeping(self, kept: str) -> "StorageError":
        """The same failure, saying ``kept`` about what is left."""
        return StorageError(self.problem, kept, self.errno)

    def __reduce__(self):  # pickled to the other ranks by DataParallel.on_main
        return StorageError, (self.problem, self.kept, self.errno)


class ConfigError(RredcotError):
    """The command line does not describe a valid config (rredcot_cli/config/); the message is one line."""


class TrainingError(RredcotError):
    """Training cannot go on (e.g. too many non-finite updates in a row)."""


# EX_TEMPFAIL (sysexits.h): "a temporary failure; the user is invited to retry". Job scripts requeue on it.
PREEMPTED_EXIT = 75


# 128 + SIGINT: the status a shell gives a command stopped by Ctrl-C (a job script does not requeue it).
INTERRUPTED_EXIT = 130


def stop_status(signal_name: str) -> str:
    """The manifest status of a run stopped by ``signal_name``: Ctrl-C interrupts, the rest preempt."""
    return "interrupted" if signal_name == "SIGINT" else "preempted"


def stop_exit_status(signal_name: str) -> int:
    """The exit status of a run stopped by ``signal_name`` (``INTERRUPTED_EXIT`` or ``PREEMPTED_EXIT``)."""
    return INTERRUPTED_EXIT if signal_name == "SIGINT" else PREEMPTED_EXIT


class Preempted(Exception):
    """``rredcot train`` stopped on a preemption signal (rredcot_cli/train/preemption.py), its state
    resumable: not an error; the CLI prints the message (one line; "" on the ranks that print
    nothing) and exits with ``exit_status`` (``PREEMPTED_EXIT``; ``INTERRUPTED_EXIT`` for Ctrl-C)."""

    def __init__(self, message: str, step: int, signal_name: str) -> None:
        super().__init__(message)
        self.step, self.signal_name = step, signal_name
        self.status, self.exit_status = stop_status(signal_name), stop_exit_status(signal_name)


def one_line(message: object) -> str:
    """``message`` as a single line: internal newlines and runs of spaces become one space."""
    return " ".join(str(message).split())


ENOSPC, EDQUOT = 28, 122
_OS_ERROR_HINTS = {
    ENOSPC: "the disk is full; free space or point run.dir at another disk",
    EDQUOT: "the disk quota is exceeded; free space or point run.dir elsewhere",
    13: "no permission; choose a writable run.dir",  # EACCES
    1: "no permission; choose a writable run.dir",  # EPERM
    30: "the file system is read-only; choose a writable run.dir",  # EROFS
}
KEPT = "outputs finished before this were kept"
# How libraries that do not raise an OSError (safetensors' Rust writer) say the disk is full.
_FULL_DISK_TEXTS = {ENOSPC: ("No space left on device", "os error 28", "StorageFull"),
                    EDQUOT: ("Disk quota exceeded", "os error 122", "QuotaExceeded")}


def os_error_message(exc: OSError, path: object = None, writing: bool | None = None) -> str:
    """One line for an ``OSError`` met on ``path`` (default: the error's own filename).

    Names the path, the system's reason, and for the common causes (full disk, no permission,
    read-only file system) what to do. ``writing`` says "cannot write" (None: only for the
    errors that come from writing).
    """
    error = storage_error(exc, path, writing=writing)
    return str(error)


def full_disk_errno(exc: BaseException) -> int | None:
    """ENOSPC or EDQUOT when ``exc`` (or an exception it was raised from) says the disk or quota is
    full, as an ``OSError`` errno or in the text of a library's own error; else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (ENOSPC, EDQUOT):
            return exc.errno
        text = str(exc)
        for number, markers in _FULL_DISK_TEXTS.items():
            if any(marker in text for marker in markers):
                return number
        exc = exc.__cause__ or exc.__context__
    return None


def human_bytes(count: float) -> str:
    """``1536`` -> ``1.5 kB``; decimal units, as ``df -H`` prints them."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def storage_error(exc: BaseException, path: object = None, *, writing: bool | None = None,
                  needed: str | None = None, free: int | None = None, errno: int | None = None) -> StorageError:
    """The one-line ``StorageError`` for a failed write of ``path`` (default: the error's filename).

    ``errno`` overrides the error's own (e.g. ENOSPC for a library error that only says it in
    text); for a full disk ``needed`` (e.g. "about 1.2 GB", "at least 3.0 MB") and ``free`` (bytes
    free on that file system) are named when known.
    """
    errno = errno or full_disk_errno(exc) or getattr(exc, "errno", None)
    where = path if path is not None else (getattr(exc, "filename", None) or "a file")
    reason = ("No space left on device" if errno == ENOSPC else "Disk quota exceeded" if errno == EDQUOT
              else getattr(exc, "strerror", None) or one_line(exc) or type(exc).__name__)
    hint = _OS_ERROR_HINTS.get(errno or -1)
    if writing is None:
        writing = hint is not None
    problem = f"cannot write {where}: {reason}" if writing else f"{where}: {reason}"
    if not hint:
        return StorageError(one_line(problem), None, errno)
    if errno in (ENOSPC, EDQUOT) and (needed or free is not None):
        what, todo = hint.split("; ", 1)
        space = ", ".join(filter(None, [f"{needed} needed" if needed else None,
                                        f"{human_bytes(free)} free there" if free is not None else None]))
        hint = f"{what}: {space}; {todo}"
    return StorageError(one_line(f"{problem} ({hint})"), KEPT, errno)
