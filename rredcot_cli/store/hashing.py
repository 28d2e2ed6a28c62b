"""Config hashes: what a stage's manifest, a checkpoint and an input's provenance check compare.

A stage folder is reused, a checkpoint resumed and an input accepted only where the settings that
made it hash alike (``runs.begin_stage``, ``train/checkpoint.py``, ``runs.check_input_provenance``).
The hash lives with the store that compares it; the config package composes and checks configs
and imports the store, never the other way round (``tests/test_house.py``, the wing order).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Settings that change no artifact of a stage that hashes their group, so config hashes and the
# inputs' provenance check leave them out: model.value_estimator only chooses RREDCoT's default
# estimator, which reaches a stage through method.value (hashed where a method runs). Leaving it out
# also keeps every hash from before it existed, so older samples still feed today's stages.
UNHASHED = ("model.value_estimator",)


def without_unhashed(data: dict) -> dict:
    """A copy of the plain config ``data`` (nested dicts) without the ``UNHASHED`` leaves."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for dotted in UNHASHED:
        group, key = dotted.split(".", 1)
        if isinstance(out.get(group), dict):
            out[group].pop(key, None)
    return out


def config_hash(cfg: DictConfig, keys: Sequence[str]) -> str:
    """First 12 hex chars of the sha256 of the resolved, key-sorted YAML of ``cfg[keys]``.

    Stable across processes and across the order of ``keys``; ``run`` should never be among
    ``keys`` (``run.dir`` differs between runs).
    """
    # deferred: --help
    import yaml
    from omegaconf import OmegaConf

    missing = [k for k in keys if k not in cfg]
    if missing:
        raise KeyError(f"config_hash: no top-level key(s) {', '.join(missing)} in the config")
    selected = OmegaConf.masked_copy(cfg, sorted(set(keys)))
    data = without_unhashed(OmegaConf.to_container(selected, resolve=True, enum_to_str=True))
    text = yaml.safe_dump(data, sort_keys=True, default_flow_style=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
