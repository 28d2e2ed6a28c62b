"""The train stage's resident memory: what it sets in the process's allocator, and the one line it
prints when a memory option it leaves to the user would save much.

**The allocator.** glibc's malloc keeps what torch frees. Blocks under its mmap threshold come from
the heap; the threshold rises (up to 32 MiB) each time a larger mmapped block is freed, so after a
few steps most activations, KV-cache growths and LM-head chunks live in the heap, and a heap only
gives back its free top. Sampling leaves a fragmented heap behind that the update cannot reuse for
its larger tensors, and the train process kept 0.5 GiB more than it used on SmolLM2-135M
(docs/studies/real-model-speed.md, "defaults"). ``return_freed_memory_to_os`` fixes the threshold at
128 KiB, as ``MALLOC_MMAP_THRESHOLD_=131072`` would: every block that large is its own mapping,
returned to the OS when torch frees it. The cost is page faults on fresh mappings (system CPU
time); results do not change (an allocator decides where bytes live, not what they hold).

**The hint.** Gradient checkpointing saves most of the update's activation memory but recomputes
each layer's forward in backward, so it changes speed and stays the user's choice;
``checkpointing_hint`` is the line that says so when the saving is large.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

# mallopt's parameter numbers (glibc's malloc.h) and the environment variable that sets each one at
# start-up; a variable the user set wins over what this module would set.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting threshold, kept fixed instead of rising
ALLOCATOR_SETTINGS = (
    (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "MALLOC_MMAP_THRESHOLD_"),
    # the heap's free top is given back above this (glibc's default, which otherwise rises with
    # the threshold)
    (M_TRIM_THRESHOLD, MMAP_THRESHOLD_BYTES, "MALLOC_TRIM_THRESHOLD_"),
    # torch's worker threads would each get a heap of their own (8 x cores by default)
    (M_ARENA_MAX, 2, "MALLOC_ARENA_MAX"),
)

# The hint: per position and decoder layer, the update keeps about 6 hidden-size and 2.5
# MLP-size fp32 values for backward (fitted to SmolLM2-135M's measured 0.8 GiB for 968 positions,
# docs/studies/real-model-speed.md); checkpointed, one hidden-size value (the layer's input).
ACTIVATION_HIDDEN_VALUES, ACTIVATION_MLP_VALUES = 6.0, 2.5
FLOOR_BYTES_PER_PARAMETER = 16  # fp32 weights + gradients + AdamW's two moments
HINT_MIN_SAVING_BYTES = 256 * 2**20  # below this no machine is short of it
HINT_MIN_SAVING_OF_FLOOR = 0.25  # ... nor is the saving worth a slower update next to the floor


@functools.cache
def return_freed_memory_to_os() -> bool:
    """Fix glibc's mmap threshold (and the trim threshold and arena count with it) so that memory
    torch frees leaves the resident set; once per process (cached), at the start of the train
    stage. True where the settings were made; False on other C libraries and systems, where
    nothing is touched."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others have no mallopt of these
        return False
    for parameter, value, variable in ALLOCATOR_SETTINGS:
        if variable not in os.environ:
            libc.mallopt(parameter, value)
    return True


def activation_bytes(positions: int, layers: int, hidden: int, intermediate: int, *, checkpointed: bool) -> int:
    """About how many bytes a forward of ``positions`` padded positions keeps for its backward."""
    per_layer = hidden if checkpointed else ACTIVATION_HIDDEN_VALUES * hidden + ACTIVATION_MLP_VALUES * intermediate
    return int(positions * layers * per_layer * 4)


def positions_per_pass(micro_batch_tokens: int, rows_per_pass: int, max_new_tokens: int) -> int:
    """The most padded positions one forward of the update can hold, prompts aside: the token
    budget (a longer single row is a pass alone), else every row of the pass at full length."""
    if micro_batch_tokens > 0:
        return max(micro_batch_tokens, max_new_tokens)
    return rows_per_pass * max_new_tokens


def checkpointing_hint(gradient_checkpointing: bool, model_config, parameters: int, positions: int) -> str | None:
    """The line to print when ``train.gradient_checkpointing`` is off and turning it on would keep
    much less: at least 256 MiB and a quarter of the weights + gradients + AdamW floor. None
    otherwise. ``model_config``: the HF config (num_hidden_layers, hidden_size,
    intermediate_size); ``parameters``: the trained ones; ``positions``: ``positions_per_pass``."""
    if gradient_checkpointing:
        return None
    shape = [getattr(model_config, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")]
    if not all(isinstance(v, int) for v in shape):
        return None  # not a decoder whose activations this estimate knows
    layers, hidden, intermediate = shape
    kept = activation_bytes(positions, layers, hidden, intermediate, checkpointed=False)
    saving = kept - activation_bytes(positions, layers, hidden, intermediate, checkpointed=True)
    floor = FLOOR_BYTES_PER_PARAMETER * parameters
    if saving < max(HINT_MIN_SAVING_BYTES, HINT_MIN_SAVING_OF_FLOOR * floor):
        return None
    return (f"memory: train.gradient_checkpointing=true would keep about {saving / 2**30:.1f} GiB less at the "
            f"update's peak (activations of up to {positions:,} positions per pass; weights + gradients + "
            f"AdamW take {floor / 2**30:.1f} GiB) for one more forward per pass (about +1/3 of the update's compute)")
