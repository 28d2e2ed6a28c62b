"""Graceful preemption: a signal asks ``rredcot train`` to stop after the step it is in, with a checkpoint.

Clusters warn a job before they end it: Slurm sends SIGTERM at preemption (and ``--signal=USR1@90``
sends SIGUSR1 90 s before the time limit); torchrun passes a SIGTERM it gets on to its workers. For
each signal of ``train.preempt_signals`` (default SIGTERM and SIGUSR1) the handler only records that
it came; at the end of every step each rank asks ``due``, which all-reduces the flag (max), so every
rank stops after the same step even when only some were signalled. The loop then writes
``checkpoints/step-N`` and raises ``errors.Preempted``; the stage marks its manifest "preempted", prints one
line and the process exits with ``errors.PREEMPTED_EXIT`` (75). ``train.resume=true`` continues from that step.

A second signal (torchrun forwarding the same SIGTERM, an impatient user) changes nothing: the
checkpoint being written finishes, and it is written atomically in any case (a SIGKILL meanwhile
leaves the previous checkpoint). The step is not interrupted, so the grace time must cover a step
and a checkpoint (torchrun waits ``--shutdown-timeout`` seconds, default 30, before it kills).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from rredcot_cli.errors import PREEMPTED_EXIT, Preempted

def signal_number(name: str) -> signal.Signals:
    """``"SIGUSR1"`` / ``"USR1"`` / ``"10"`` -> the signal; ValueError naming the valid ones."""
    text = str(name).strip().upper()
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG")
                                                                             else f"SIG{text}"]
    except (KeyError, ValueError):
        raise ValueError(f"train.preempt_signals: unknown signal {name!r}; use names such as SIGTERM, SIGUSR1, "
                         "SIGUSR2, SIGINT") from None


class Preemption:
    """The preemption signals of one run, handled while the ``with`` block runs (the previous handlers
    come back after it). Handlers are installed only in the main thread (Python's rule)."""

    def __init__(self, names) -> None:
        self.signals = [signal_number(name) for name in names]
        self.received: signal.Signals | None = None
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
        if self.received is None:  # the first signal counts; later ones change nothing
            self.received = signal.Signals(number)

    def due(self, parallel) -> bool:
        """Whether any rank got a preemption signal; every rank calls it at the same step boundary."""
        flag = 1.0 if self.received is not None else 0.0
        return parallel.sum([flag])[0] > 0

    def stop(self, step: int, steps: int, checkpoint, is_main: bool) -> Preempted:
        """The ``Preempted`` to raise after ``checkpoint`` (the folder just written) at ``step``."""
        name = self.received.name if self.received is not None else "a signal on another rank"
        message = (f"preempted by {name}: stopped after step {step} of {steps} and saved {checkpoint}; continue "
                   f"with the same command plus train.resume=true (exit status {PREEMPTED_EXIT})")
        return Preempted(message if is_main else "", step, name)
