"""Graceful preemption: a signal asks ``rredcot train`` to stop after the step it is in, with a checkpoint.

Clusters warn a job before they end it: Slurm sends SIGTERM at preemption (and ``--signal=USR1@90``
sends SIGUSR1 90 s before the time limit); torchrun passes a SIGTERM it gets on to its workers; a
user presses Ctrl-C (SIGINT). The handlers of ``train.preempt_signals`` (default SIGTERM, SIGUSR1 and
SIGINT) are active for the whole stage, from before its folder is begun to its last write:

- **During a step** (sampling, credit, update, periodic eval and checkpoint) the handler only records
  that a signal came; at the end of every step each rank asks ``due``, which all-reduces the flag
  (max), so every rank stops after the same step even when only some were signalled. The loop
  writes ``checkpoints/step-N`` and raises ``errors.Preempted``; the stage marks its manifest
  "preempted" ("interrupted" for SIGINT), prints one line, and the process exits with
  ``errors.PREEMPTED_EXIT`` (75; SIGINT: 130). A rerun of the same command continues from that step.
- **Where there is no step to finish** (start-up: loading, restoring, the held-out eval before
  training; the end: the final weights and eval) waiting would only spend the grace time, so a
  signal stops at once (``at_once``: the handler raises ``StopNow``; under torchrun, at the end of
  the phase, on every rank together). At the end the last step is checkpointed first, so a rerun
  only redoes the final weights and eval.

A second signal (torchrun forwarding the same SIGTERM, an impatient user) changes nothing: the
checkpoint being written finishes, and it is written atomically in any case (a SIGKILL meanwhile
leaves the previous checkpoint). The exception is a second Ctrl-C, which stops at once: the first
said so ("press Ctrl-C again to stop at once"). The step is not interrupted, so the grace time must
cover a step and a checkpoint (torchrun waits ``--shutdown-timeout`` seconds, default 30, before it
kills).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from types import FrameType
from typing import Iterator

from rredcot_cli.config.schema import signal_number
from rredcot_cli.console import console
from rredcot_cli.errors import Preempted, stop_exit_status, stop_status

class StopNow(BaseException):
    """A signal that stops the stage at once (``Preemption.at_once``, or a second Ctrl-C). A
    ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception`` on the way
    swallows it; the stage turns it into ``errors.Preempted``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.signal_name = name


class Preemption:
    """The preemption signals of one run, handled while the ``with`` block runs (the previous handlers
    come back after it). Handlers are installed only in the main thread (Python's rule)."""

    def __init__(self, names) -> None:
        self.signals = [signal_number(name) for name in names]
        self.received: signal.Signals | None = None
        self.step: int | None = None  # the step running, for the Ctrl-C line
        self._at_once = False
        self._previous: dict[signal.Signals, object] = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for number in self.signals:
                self._previous[number] = signal.signal(number, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()

    def _record(self, number: int, frame: FrameType | None) -> None:
        number = signal.Signals(number)
        if self._at_once or (number == signal.SIGINT and self.received is not None):
            self.received = self.received or number
            raise StopNow(number.name)
        if self.received is None:  # the first signal counts; later ones change nothing
            self.received = number
            if number == signal.SIGINT:
                doing = f"finishing step {self.step}" if self.step is not None else "finishing"
                console.print(f"Ctrl-C: {doing} and saving a checkpoint; press Ctrl-C again to stop at once")

    @contextmanager
    def at_once(self, parallel) -> Iterator[None]:
        """A phase with no step to finish: a signal (or one that came before) raises ``StopNow``. Under
        torchrun a rank stopping alone would leave the others at a collective, so there every rank
        raises it together after the phase (``due``)."""
        if parallel.distributed:
            yield
            if self.due(parallel):
                raise StopNow(self.received.name if self.received is not None else "a signal on another rank")
            return
        if self.received is not None:
            raise StopNow(self.received.name)
        self._at_once = True
        try:
            yield
        finally:
            self._at_once = False

    def due(self, parallel) -> bool:
        """Whether any rank got a preemption signal; every rank calls it at the same step boundary."""
        flag = 1.0 if self.received is not None else 0.0
        return parallel.sum([flag])[0] > 0

    def stop(self, step: int, steps: int, checkpoint, is_main: bool) -> Preempted:
        """The ``Preempted`` to raise after ``checkpoint`` (the folder just written) at ``step``."""
        name = self.received.name if self.received is not None else "a signal on another rank"
        message = (f"{stop_status(name)} by {name}: stopped after step {step} of {steps} and saved {checkpoint}; "
                   f"continue with the same command plus train.resume=true (exit status {stop_exit_status(name)})")
        return Preempted(message if is_main else "", step, name)
