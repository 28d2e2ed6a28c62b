"""Registry of credit-assignment methods: one module per method, each registering itself.

Adding a method means adding one file here that decorates its function with ``@register``;
stages look methods up by name and never branch on it. Methods from outside the package register
the same way, from a module named by an entry point of group ``rredcot.methods`` (imported when
its name is first looked up) or by ``plugins=[...]`` (``rredcot_cli.plugins``); see
docs/extending.md for the contract.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable

from rredcot_cli.docstrings import doc_summary
from rredcot_cli.methods import _options
from rredcot_cli.methods._options import MethodOption
from rredcot_cli.plugins import METHOD_GROUP, PluginError, entry_point_names, load_entry_point


@dataclass(frozen=True)
class MethodSpec:
    name: str
    fn: Callable  # fn(batch: CreditBatch, **params, **needs) -> Credit
    # Dataclass of hyper-parameters with defaults; its fields are the config keys, a Literal[...]
    # type gives an option's choices (checked when the config is composed) and a comment on or
    # right above a field its meaning (``options()``, ``rredcot list methods NAME``).
    params: type
    needs: tuple[str, ...] = ()  # injected collaborators, e.g. ("scorer",)
    # The credit of a row depends on other groups of the batch (e.g. whitening over the batch),
    # so data-parallel training computes it on the whole batch rather than per rank's groups.
    batch_wide: bool = False
    # Meaningful range of each numeric parameter, as in rredcot_cli.config.schema.RANGES ("> 0",
    # "[0, 1)", ...); checked when the config is composed (method.<param>=value).
    ranges: dict[str, str] = field(default_factory=dict)
    # Whether the method, with these hyper-parameters (a dict of its params), scores a forced answer
    # ("The final answer is {answer}") and so needs the benchmark's ANSWER_PROBE or
    # method.probe_template; checked before a stage makes its folder (preflight).
    forced_answer: Callable[[dict], bool] | None = None
    # Whether, with these hyper-parameters, the method also picks which tokens carry the
    # policy-gradient term: ``loss_tokens(params)`` returns ``fn(entropies (B, T), mask (B, T)) ->
    # (B, T)`` 0/1 weights, applied to every forward of the update (``train/update.py``), or None.
    loss_tokens: Callable[[dict], Callable | None] | None = None
    # Options whose valid values are the names in another registry, which plugins can extend (so
    # no Literal can list them): option -> a function returning those names, e.g. rredcot's
    # ``value`` -> the value estimators. Checked and listed like a Literal's choices.
    registry_choices: dict[str, Callable[[], list[str]]] = field(default_factory=dict)

    def param_names(self) -> list[str]:
        return [f.name for f in fields(self.params)]

    def choices(self) -> dict[str, tuple[Any, ...]]:
        """Parameter -> its allowed values, for each parameter typed ``Literal[...]`` (None among
        them when it is ``Optional``)."""
        return {**_options.choices(self.params), **{key: tuple(names()) for key, names in self.registry_choices.items()}}

    def options(self) -> list[MethodOption]:
        """Every parameter with its type or choices, default, range and meaning (its comment):
        what ``rredcot list methods NAME`` shows and a generated reference can print."""
        found = _options.options(self.params, self.ranges)
        return [replace(o, choices=tuple(self.registry_choices[o.name]()),
                        type="one of: " + ", ".join(self.registry_choices[o.name]()))
                if o.name in self.registry_choices else o for o in found]

    def plain_params(self) -> type:
        """``params`` with each ``Literal`` field typed by its values' type, for OmegaConf
        (which rejects ``Literal``); the choices are checked from ``choices()`` instead."""
        return _options.plain_params(self.params)

    def summary(self) -> str:
        """One line on what the method is, from its module's docstring (a built-in method's file
        is the method), else its function's (a plugin's file may hold several)."""
        module = inspect.getmodule(self.fn)
        own_module = module is not None and module.__name__ == f"{__name__}.{self.name}"
        doc = module.__doc__ if own_module else self.fn.__doc__
        return doc_summary(doc, self.name)

    def scores_forced_answer(self, params: dict) -> bool:
        return self.forced_answer is not None and bool(self.forced_answer(params))

    def token_selection(self, params: dict) -> Callable | None:
        """The update's token selection for these hyper-parameters (``loss_tokens``), or None."""
        return self.loss_tokens(params) if self.loss_tokens is not None else None


_REGISTRY: dict[str, MethodSpec] = {}
_NOT_METHOD_MODULES = {"base"}


def register(name: str, params: type, needs: tuple[str, ...] = (), batch_wide: bool = False,
             ranges: dict[str, str] | None = None, forced_answer: Callable[[dict], bool] | None = None,
             loss_tokens: Callable[[dict], Callable | None] | None = None,
             registry_choices: dict[str, Callable[[], list[str]]] | None = None) -> Callable:
    """Register ``fn`` as credit method ``name``; ``ranges`` gives each numeric parameter of
    ``params`` its meaningful range (``{"eps": ">= 0"}``, see ``rredcot_cli.config.schema.RANGES``);
    ``forced_answer(params)`` says whether it scores a forced answer; ``loss_tokens(params)`` gives
    the update's token selection, if any; ``registry_choices`` names options whose values are
    another registry's names (``MethodSpec``)."""

    def decorator(fn: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"credit method {name!r} is registered twice")
        _REGISTRY[name] = MethodSpec(name=name, fn=fn, params=params, needs=needs, batch_wide=batch_wide,
                                     ranges=dict(ranges or {}), forced_answer=forced_answer,
                                     loss_tokens=loss_tokens, registry_choices=dict(registry_choices or {}))
        return fn

    return decorator


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name not in _NOT_METHOD_MODULES and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


def registered_names() -> list[str]:
    """Names registered so far in this process (no discovery, no import)."""
    return sorted(_REGISTRY)


def _load_entry_point(name: str) -> None:
    """Import the plugin module behind entry point ``name`` of group ``rredcot.methods``; it must
    register a method of that name (``@register(name, ...)``)."""
    loaded = load_entry_point(METHOD_GROUP, name)
    if name not in _REGISTRY:
        raise PluginError(f"entry point '{name}' of group {METHOD_GROUP} was imported but registered no method "
                          f"'{name}'; decorate its function with @rredcot_cli.methods.register({name!r}, params=...)")
    if callable(loaded) and not isinstance(loaded, type) and loaded is not _REGISTRY[name].fn:
        raise PluginError(f"entry point '{name}' of group {METHOD_GROUP} points at {loaded!r}, but method "
                          f"'{name}' is registered as {_REGISTRY[name].fn!r}")


def method_names() -> list[str]:
    """Built-in methods, methods registered by plugins, and entry points of group
    ``rredcot.methods`` (listed without importing them)."""
    _discover()
    return sorted(set(_REGISTRY) | set(entry_point_names(METHOD_GROUP)))


def get_method(name: str) -> MethodSpec:
    """The registry entry of ``name``. KeyError if no method has that name; ``PluginError`` (one
    line) if its entry point fails to import or registers nothing under that name."""
    _discover()
    if name not in _REGISTRY:
        if name not in entry_point_names(METHOD_GROUP):
            raise KeyError(f"unknown method {name!r}; valid: {', '.join(method_names())}")
        _load_entry_point(name)
    return _REGISTRY[name]


def method_and_params(settings: dict) -> tuple[MethodSpec, dict]:
    """The registry entry of a resolved ``method.*`` config group (a plain dict) and its
    hyper-parameters as plain kwargs (every key but the name)."""
    return get_method(settings["name"]), {k: v for k, v in settings.items() if k != "name"}
