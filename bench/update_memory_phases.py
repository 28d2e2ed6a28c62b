"""Resident memory of ``rredcot train`` around every phase and every forward, backward and optimizer
step of the update, run in this process: where the peak RSS of a run goes (issue 42, item 1).

    PROBE_OUT=phases.log python bench/update_memory_phases.py train model=smollm2-135m-instruct ...

Writes one line per mark to ``PROBE_OUT`` (default memory_phases.log): seconds since start, the
mark (``begin:``/``end:`` a step phase, ``steptime.PHASE_OBSERVERS``; ``pre:``/``post:`` a call of
``ForwardPass.logprobs`` (``fwd``, with ``[rows x longest prompt + longest completion = padded
positions]``; ``(ng)`` without gradients), ``GradientStepper.backward`` (``bwd``), its ``step``
(``optstep``) and ``policy_update``), then in GiB: ``rss`` now, ``hwm`` the resident peak since
the previous mark (the kernel's high-water mark, reset at every mark through
/proc/self/clear_refs, Linux >= 4.0), ``anon``/``file`` resident pages, and glibc's
``mallinfo2``: heap bytes in use and free, bytes in mmapped blocks (and their count). The peak of
the run is the largest ``hwm``; ``post:fwd rss`` minus ``pre:fwd rss`` of a pass with gradients is
what its forward keeps for backward.

Resetting the high-water mark also resets what ``/usr/bin/time -v`` reports as the maximum
resident set size: read the peak from the log, not from time. glibc only (``mallinfo2``, 2.33+).
"""

import ctypes
import os
import runpy
import sys
import time


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


LIBC = ctypes.CDLL(None)
LIBC.mallinfo2.restype = MallInfo2
OUT = open(os.environ.get("PROBE_OUT", "memory_phases.log"), "a")
START = time.time()


def status() -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process, GiB."""
    found = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            found[key] = int(value.split()[0]) / 2**20
    return found


def mark(label: str) -> None:
    s, m = status(), LIBC.mallinfo2()
    OUT.write(f"{time.time() - START:8.1f} {label:32s} rss {s['VmRSS']:.3f} hwm {s['VmHWM']:.3f} "
              f"anon {s['RssAnon']:.3f} file {s['RssFile']:.3f} heap_used {m.uordblks / 2**30:.3f} "
              f"heap_free {m.fordblks / 2**30:.3f} mmapped {m.hblkhd / 2**30:.3f} ({m.hblks})\n")
    OUT.flush()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the high-water mark starts again from the resident set now


def watch(owner, attr: str, label: str) -> None:
    """Mark before and after every call of ``owner.attr``."""
    # deferred: torch after the first mark, so that the start's resident set is the interpreter's
    import torch

    original = getattr(owner, attr)

    def watched(*args, **kwargs):
        tag = label if torch.is_grad_enabled() else f"{label}(ng)"
        if label == "fwd":  # ForwardPass.logprobs(self, model, prompt_ids, completion_ids, ...)
            prompts, completions = args[2], args[3]
            width = max(map(len, prompts)) + max(map(len, completions))
            tag += f"[{len(prompts)}x{max(map(len, prompts))}+{max(map(len, completions))}={len(prompts) * width}]"
        mark(f"pre:{tag}")
        result = original(*args, **kwargs)
        mark(f"post:{tag}")
        return result

    setattr(owner, attr, watched)


def main() -> None:
    mark("start")
    # deferred: imported after the first mark (the interpreter's own resident set comes first)
    from rredcot_cli.policy import logprobs
    from rredcot_cli.train import precision, steptime, update

    steptime.PHASE_OBSERVERS.append(lambda event, name: mark(f"{event}:{name}"))
    watch(logprobs.ForwardPass, "logprobs", "fwd")
    watch(precision.GradientStepper, "backward", "bwd")
    watch(precision.GradientStepper, "step", "optstep")
    watch(update, "policy_update", "policy_update")  # before the loop imports it by name
    sys.argv = ["rredcot_cli", *sys.argv[1:]]
    try:
        runpy.run_module("rredcot_cli", run_name="__main__")
    finally:
        mark("end")


if __name__ == "__main__":
    main()
