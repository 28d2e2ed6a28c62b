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


def one_line(message: object) -> str:
    """``message`` as a single line: internal newlines and runs of spaces become one space."""
    return " ".join(str(message).split())
