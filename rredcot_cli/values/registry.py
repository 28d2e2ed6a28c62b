"""Registry of RREDCoT's state-value estimators: one function per estimator, looked up by name.

An estimator answers one question, V(S_i,k) for listed prefixes of every trace of a batch, from the
policy's own log-probabilities and the *other* traces of the group, never from the trace's own
outcome (``tests/values/test_value_leak.py`` flips each trace's reward and checks that none of its
values moves, for every registered estimator). Where it has nothing to go on at a boundary it
returns NaN there; RREDCoT then keeps the previous value (zero credit for that segment) and counts
the boundary as uncovered (``value_coverage``), rather than filling in anything.

Built-ins register from their modules (``answer_probe``, ``answer_share``, ``suffix_is``); a plugin
module registers the same way (``@register_value_estimator("mine")``) and is then valid as
``method.value=mine``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from rredcot_cli.methods.base import CreditBatch

_BUILT_IN_MODULES = ("answer_probe", "suffix_is")


@dataclass(frozen=True)
class ValueSettings:
    """What an estimator may be told, from RREDCoT's parameters (``methods/rredcot.py``)."""

    probe_template: Optional[str] = None  # forced-answer template with {answer} (and {eos}); None = the benchmark's
    matched: bool = True  # suffix_is: only suffixes cut at the same segment index
    window: int = 1  # suffix_is: likelihood-ratio length (0 = the whole suffix)
    window_unit: str = "segments"  # suffix_is: segments | tokens
    self_normalised: bool = False  # suffix_is: self-normalised instead of ordinary importance sampling
    clip: float = 20.0  # suffix_is: max importance weight (0 = off)
    probe_scoring: str = "auto"  # auto | kv_cache | packed


# fn(batch, policy, offsets, settings) -> one float32 tensor per trace, (len(offsets[i]),): V after
# completion-token offset offsets[i][k] of trace i, NaN where the estimator has no evidence.
ValueFn = Callable[[CreditBatch, Any, list[list[int]], ValueSettings], list[torch.Tensor]]


@dataclass(frozen=True)
class ValueEstimator:
    name: str
    fn: ValueFn
    forced_answer: bool = False  # scores a forced answer, so it needs an answer-probe template


_REGISTRY: dict[str, ValueEstimator] = {}


def register_value_estimator(name: str, *, forced_answer: bool = False) -> Callable[[ValueFn], ValueFn]:
    """Register ``fn`` as value estimator ``name`` (``method.value=name``)."""

    def decorator(fn: ValueFn) -> ValueFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"value estimator {name!r} is registered twice")
        _REGISTRY[name] = ValueEstimator(name=name, fn=fn, forced_answer=forced_answer)
        return fn

    return decorator


def _discover() -> None:
    for module in _BUILT_IN_MODULES:
        importlib.import_module(f"rredcot_cli.values.{module}")


def value_estimator_names() -> list[str]:
    """Every registered estimator: the built-ins and those plugins registered in this process."""
    _discover()
    return sorted(_REGISTRY)


def get_value_estimator(name: str) -> ValueEstimator:
    """The estimator called ``name``; ValueError (one line, the valid names) for an unknown one."""
    _discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown value estimator {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
