"""Registry of credit-assignment methods: one module per method, each registering itself.

Adding a method means adding one file here that decorates its function with ``@register``;
stages look methods up by name and never branch on it.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field, fields
from typing import Callable


@dataclass(frozen=True)
class MethodSpec:
    name: str
    fn: Callable  # fn(batch: CreditBatch, **params, **needs) -> Credit
    params: type  # dataclass of hyper-parameters with defaults; its fields are the config keys
    needs: tuple[str, ...] = ()  # injected collaborators, e.g. ("scorer",)
    # The credit of a row depends on other groups of the batch (e.g. whitening over the batch),
    # so data-parallel training computes it on the whole batch rather than per rank's groups.
    batch_wide: bool = False
    # Meaningful range of each numeric parameter, as in rredcot_cli.schema.RANGES ("> 0",
    # "[0, 1)", ...); checked when the config is composed (method.<param>=value).
    ranges: dict[str, str] = field(default_factory=dict)

    def param_names(self) -> list[str]:
        return [f.name for f in fields(self.params)]


_REGISTRY: dict[str, MethodSpec] = {}
_NOT_METHOD_MODULES = {"base"}


def register(name: str, params: type, needs: tuple[str, ...] = (), batch_wide: bool = False,
             ranges: dict[str, str] | None = None) -> Callable:
    """Register ``fn`` as credit method ``name``; ``ranges`` gives each numeric parameter of
    ``params`` its meaningful range (``{"eps": ">= 0"}``, see ``rredcot_cli.schema.RANGES``)."""

    def decorator(fn: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"credit method {name!r} is registered twice")
        _REGISTRY[name] = MethodSpec(name=name, fn=fn, params=params, needs=needs, batch_wide=batch_wide,
                                     ranges=dict(ranges or {}))
        return fn

    return decorator


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_METHOD_MODULES and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def method_names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_method(name: str) -> MethodSpec:
    _discover()
    if name not in _REGISTRY:
        raise KeyError(f"unknown method {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
