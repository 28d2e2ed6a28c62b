"""Minor page faults and CPU seconds per phase of ``rredcot train``, run in this process.

Wraps ``steptime.StepClock.phase`` so each phase (sampling, credit, update, ...) also records the
change in ``getrusage`` minor faults and user+system CPU seconds (inclusive of nested phases),
then runs the CLI with the given arguments and appends one JSON line per run to ``FAULTS_OUT``
(default faults.jsonl), labelled ``LABEL`` and with the MALLOC_* variables in effect. Fault
counts do not depend on what else runs on the machine, so an allocator A/B can be read on a
busy one; CPU seconds less so.

    LABEL=grpo-default python bench/phase_faults.py train method=grpo seed=0 train.steps=8 ...
    MALLOC_MMAP_THRESHOLD_=33554432 LABEL=grpo-malloc python bench/phase_faults.py train ...
"""

import atexit
import json
import os
import resource
import sys
from contextlib import contextmanager

import rredcot_cli.train.steptime as steptime

totals: dict[str, dict] = {}
_original_phase = steptime.StepClock.phase


@contextmanager
def _counted_phase(self, name):
    before = resource.getrusage(resource.RUSAGE_SELF)
    with _original_phase(self, name):
        yield
    after = resource.getrusage(resource.RUSAGE_SELF)
    entry = totals.setdefault(name, {"calls": 0, "minflt": 0, "cpu": 0.0})
    entry["calls"] += 1
    entry["minflt"] += after.ru_minflt - before.ru_minflt
    entry["cpu"] += (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _dump() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {"label": os.environ.get("LABEL"), "argv": sys.argv[1:], "phases": totals,
              "total_minflt": usage.ru_minflt, "total_cpu": usage.ru_utime + usage.ru_stime,
              "maxrss_mb": usage.ru_maxrss / 1024, "env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC")}}
    with open(os.environ.get("FAULTS_OUT", "faults.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    steptime.StepClock.phase = _counted_phase
    atexit.register(_dump)
    from rredcot_cli.cli import app

    sys.argv = ["rredcot", *sys.argv[1:]]
    app()
