"""Every seed and random state of rredcot, in one place: the seeds derived from ``cfg.seed``, the
global generators seeded at the start of a stage, and the states a checkpoint captures so a resumed
run draws what an uninterrupted one would.

Objects that own a generator (the trainer's minibatch shuffler, the critic, the MC continuation
sampler) seed it from ``derive_seed`` and save it with their own state.
"""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import torch


def derive_seed(seed: int, *keys: str | int) -> int:
    """A 31-bit seed derived from ``seed`` and ``keys``, stable across processes and machines.

    ``derive_seed(cfg.seed, "sample", prompt_id, k)``: different keys give independent seeds;
    the string "1" and the int 1 are different keys.
    """
    payload = json.dumps([int(seed), *keys], separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (every stage does this first)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict:
    """Every random state the loop may draw from, in types ``torch.load(weights_only=True)`` reads."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    """Put back the states ``rng_states`` captured."""
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
