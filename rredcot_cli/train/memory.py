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

**Gradient checkpointing.** It recomputes each decoder layer's forward in backward instead of
keeping the layer's activations: the same numbers (the same ops on the same inputs; checked bit
for bit), less memory, one more forward per pass. ``train.gradient_checkpointing=auto`` (the
default) turns it on where the estimated saving is large next to the weights + gradients + AdamW
floor (``choose_checkpointing``), and the stage prints one line saying so, what it saves and costs,
and how to turn it off; ``true``/``false`` decide without a line.
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

# Per position and decoder layer, the update keeps about 10 hidden-size and 4 MLP-size fp32 values
# for backward: on SmolLM2-135M 11.8-12.1k values, measured per forward of the update on the issue-27
# shape (1.31 GiB kept for a pass of 16 rows x 62 positions; docs/studies/real-model-speed.md,
# "Defaults"); checkpointed, one hidden-size value (the layer's input: 0.07 GiB for that pass).
ACTIVATION_HIDDEN_VALUES, ACTIVATION_MLP_VALUES = 10.0, 4.0
FLOOR_BYTES_PER_PARAMETER = 16  # fp32 weights + gradients + AdamW's two moments
MIN_SAVING_BYTES = 256 * 2**20  # below this no machine is short of it
MIN_SAVING_OF_FLOOR = 0.25  # ... nor is the saving worth a slower update next to the floor
CHECKPOINTING_CHOICES = ("auto", True, False)  # train.gradient_checkpointing
# What the recomputed forwards cost where it was measured (bench/checkpointing_cost.py: the issue-27
# shape's passes, interleaved A/B, busy machine): less than a third, as the chunked LM head is
# recomputed in backward either way.
COST_MEASURED = "+13-17% of the update's CPU on SmolLM2-135M"


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


def checkpointing_saving(model_config, parameters: int, positions: int) -> int | None:
    """About how many bytes gradient checkpointing keeps less at the update's peak, where that is
    large: at least 256 MiB and a quarter of the weights + gradients + AdamW floor; None where it
    is not, or where the model is not a decoder whose activations ``activation_bytes`` knows.
    ``model_config``: the HF config (num_hidden_layers, hidden_size, intermediate_size);
    ``parameters``: the trained ones; ``positions``: ``positions_per_pass``."""
    shape = [getattr(model_config, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")]
    if not all(isinstance(v, int) for v in shape):
        return None
    layers, hidden, intermediate = shape
    saving = (activation_bytes(positions, layers, hidden, intermediate, checkpointed=False)
              - activation_bytes(positions, layers, hidden, intermediate, checkpointed=True))
    floor = FLOOR_BYTES_PER_PARAMETER * parameters
    return saving if saving >= max(MIN_SAVING_BYTES, MIN_SAVING_OF_FLOOR * floor) else None


def choose_checkpointing(setting, model_config, parameters: int, positions: int,
                         supported: bool = True) -> tuple[bool, str | None]:
    """Whether the update checkpoints its decoder layers (``train.gradient_checkpointing``), and
    the one line the stage prints about it (None: nothing to say). ``true``/``false`` are the
    user's choice, kept silently; ``auto`` turns it on where ``checkpointing_saving`` is large and
    the model ``supported`` it, and says so. Arguments as ``checkpointing_saving``'s."""
    if setting not in CHECKPOINTING_CHOICES:
        raise ValueError(f"train.gradient_checkpointing={setting}: expected auto, true or false")
    if setting != "auto":
        return bool(setting), None
    saving = checkpointing_saving(model_config, parameters, positions) if supported else None
    if saving is None:
        return False, None
    floor = FLOOR_BYTES_PER_PARAMETER * parameters
    return True, (f"memory: gradient checkpointing on (train.gradient_checkpointing=auto): about "
                  f"{saving / 2**30:.1f} GiB less at the update's peak (activations of up to {positions:,} positions "
                  f"per pass; weights + gradients + AdamW take {floor / 2**30:.1f} GiB), same numbers, for one more "
                  f"forward of the decoder layers per pass ({COST_MEASURED}); train.gradient_checkpointing=false "
                  f"turns it off")
