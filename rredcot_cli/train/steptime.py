"""Where a training step's time goes: wall seconds per phase, written into every metrics row.

The train loop opens a phase around each part of a step (``with clock.phase("sampling"): ...``)
and ``policy_update`` opens the old and reference log-prob passes inside the update. Time is
*exclusive*: a phase opened inside another (``old_logprobs`` inside ``update``) counts in its own
column only, so the columns of a step add up to the time spent in phases. ``bench/throughput.py``
turns them into tokens/s per phase.

``PHASE_OBSERVERS`` is the seam for timing the loop from outside without touching it:
``bench/scaling.py`` appends a callback that records when each phase opens and closes, on every
rank, and lines them up with its communication timers.

Phases (metrics columns ``seconds_<phase>``):
  sampling      generate + verify the step's groups (every draw, with dynamic sampling)
  segment       segmentation (and the entropy pass of entropy-based rules)
  credit        packing the credit batch and the credit method (value estimation for rredcot)
  old_logprobs  the pre-update pass over the batch (old log-probs and entropies)
  ref_logprobs  the reference model's pass (train.kl_coef > 0)
  update        forward/backward over the minibatches, clipping, optimizer steps
  refresh       weight refresh/sync after the update (data-parallel copies, vLLM), critic fit
  eval          held-out evaluation on eval steps (not part of the step's ``seconds``)
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import Callable, ContextManager, Iterator

from rredcot_cli.store.artifacts import PHASES  # the metrics schema's phases (one list, kept there)

# The metrics columns that hold wall-clock time (the step's and its phases'): what differs between
# two runs that compute the same thing.
CLOCK_COLUMNS = ("seconds", *(f"seconds_{name}" for name in PHASES))

# Callbacks every StepClock calls as ``observer(event, name)``, event "begin" right before a phase
# opens and "end" right after it closes (a step starts with the "sampling" phase). Empty unless a
# bench appends to it; an observer's own time falls outside the phase it reports.
PHASE_OBSERVERS: list[Callable[[str, str], None]] = []


class StepClock:
    """Exclusive wall seconds per phase since the last ``reset``."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._nested: list[float] = []  # per open phase: seconds spent in phases opened inside it

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r}; valid: {', '.join(PHASES)}")
        for observer in PHASE_OBSERVERS:
            observer("begin", name)
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            elapsed = time.perf_counter() - start
            inner = self._nested.pop()
            self.seconds[name] += elapsed - inner
            if self._nested:
                self._nested[-1] += elapsed
            for observer in PHASE_OBSERVERS:
                observer("end", name)

    def columns(self) -> dict[str, float]:
        """The metrics columns ``seconds_<phase>``."""
        return {f"seconds_{name}": value for name, value in self.seconds.items()}


def phase(clock: StepClock | None, name: str) -> ContextManager:
    """``clock.phase(name)``, or nothing without a clock (callers outside the train loop)."""
    return clock.phase(name) if clock is not None else nullcontext()
