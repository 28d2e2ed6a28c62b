"""What a composed config must satisfy beyond its types, checked once, with one ``ConfigError``
line for the first value that does not: the numeric ranges of ``schema.RANGES`` and of each
method's registry entry (``">= 1"``, ``"[0, 1)"``, bounds may name other options); the choices of
the schema's fields (``schema.one_of``) and of each method's options (the ``Literal[...]`` fields
of its params dataclass); and the checks between options of a group (its ``problems()``).

``config.compose`` imports this module, and the CLI imports that for ``rredcot --help``: OmegaConf,
the schema, the method registry and the preemption signal names are imported inside the functions
that use them (marked "deferred").
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Any

from rredcot_cli.config.messages import closest
from rredcot_cli.errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

@dataclasses.dataclass(frozen=True)
class Range:
    """A parsed range spec (``rredcot_cli.config.schema.RANGES``): bounds are numbers or option names."""

    low: float | str | None
    high: float | str | None
    low_open: bool
    high_open: bool
    note: str
    text: str  # "> 0", "in [0, 1)", ... as the message shows it


_BOUND = r"(-?inf|[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|[A-Za-z_][\w.]*)"


def _bound(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def parse_range(spec: str) -> Range:
    """``">= 1"``, ``"> 0"``, ``"<= 1"``, ``"< 1"`` or ``"[0, 1)"`` (bounds may name options),
    optionally followed by ``"; note"``. Raises ``ValueError`` for anything else (a bug in a table)."""
    body, _, note = spec.partition(";")
    body, note = body.strip(), note.strip()
    found = re.fullmatch(rf"(>=|>|<=|<)\s*{_BOUND}", body)
    if found:
        op, value = found.group(1), _bound(found.group(2))
        if op.startswith(">"):
            return Range(value, None, op == ">", False, note, body)
        return Range(None, value, False, op == "<", note, body)
    found = re.fullmatch(rf"([\[(])\s*{_BOUND}\s*,\s*{_BOUND}\s*([\])])", body)
    if found:
        low, high = _bound(found.group(2)), _bound(found.group(3))
        return Range(low, high, found.group(1) == "(", found.group(4) == ")", note, f"in {body}")
    raise ValueError(f"not a range spec: {spec!r}")


def spelled(choice: Any) -> str:
    """A choice as it is typed on the command line or in YAML: null, true, false, or itself."""
    if choice is None:
        return "null"
    if isinstance(choice, bool):
        return str(choice).lower()
    return str(choice)


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def range_error(key: str, value: Any, spec: str, lookup: Any) -> str | None:
    """The one-line complaint about ``key=value`` outside ``spec``, or None when it is inside.

    ``lookup(name)`` gives the value of an option a bound names. A list value is checked entry by
    entry; null and non-numbers (a type error is Hydra's to report) pass."""
    rng = parse_range(spec)
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    named = {}
    bounds = []
    for bound in (rng.low, rng.high):
        if isinstance(bound, str):  # another option's value
            named[bound] = lookup(bound)
            bound = named[bound]
        bounds.append(float(bound) if _is_number(bound) else None)
    low, high = bounds
    for v in values:
        if not _is_number(v):
            continue
        if math.isnan(v) or (low is not None and (v < low or (rng.low_open and v == low))) or \
                (high is not None and (v > high or (rng.high_open and v == high))):
            break
    else:
        return None
    each = "each entry " if isinstance(value, (list, tuple)) else ""
    extra = [f"{name}={_show(v)}" for name, v in named.items()]
    if rng.note:
        extra.append(rng.note)
    detail = f" ({'; '.join(extra)})" if extra else ""
    return f"{key}={_show(value)}: {each}must be {rng.text}{detail}"


def check_ranges(cfg: DictConfig) -> None:
    """Refuse a numeric option outside its range (``schema.RANGES``, ``schema.DIVISIBLE_BY``), and
    a method parameter outside its choices or the range its registry entry declares
    (``check_method_params``): one ``ConfigError`` line."""
    # deferred: --help
    from omegaconf import OmegaConf

    from rredcot_cli.config.schema import DIVISIBLE_BY, RANGES

    def lookup(key: str) -> Any:
        return OmegaConf.select(cfg, key)

    # A value's own range before a bound that names another option, so "benchmark.max_steps=0"
    # is reported as such rather than as a min_steps above it.
    for key, spec in sorted(RANGES.items(), key=lambda item: _names_an_option(item[1])):
        value = lookup(key)
        if OmegaConf.is_list(value):
            value = OmegaConf.to_container(value)
        problem = range_error(key, value, spec, lookup)
        if problem:
            raise ConfigError(problem)
    for key, divisor_key in DIVISIBLE_BY:
        value, divisor = lookup(key), lookup(divisor_key)
        if _is_number(value) and _is_number(divisor) and divisor and value % divisor:
            raise ConfigError(f"{key}={value}: must be a multiple of {divisor_key}={divisor}")
    _check_groups(cfg)
    if cfg.method is not None and cfg.method.get("name"):
        check_method_params(cfg.method.name, OmegaConf.to_container(cfg.method, resolve=True), "method.")


def _check_groups(cfg: DictConfig) -> None:
    """Refuse a schema field outside its choices (``schema.one_of``), a group whose
    ``problems()`` finds a clash between its options, and an unknown ``train.preempt_signals`` name."""
    # deferred: --help
    from omegaconf import OmegaConf

    from rredcot_cli.config.schema import Config, signal_number

    for name, group in _schema_groups(Config()):
        for f in dataclasses.fields(group):
            if "choices" in f.metadata:
                problem = choice_error(f"{name}.{f.name}", OmegaConf.select(cfg, f"{name}.{f.name}"), f.metadata["choices"])
                if problem:
                    raise ConfigError(problem)
        if hasattr(group, "problems"):
            found = OmegaConf.to_object(OmegaConf.select(cfg, name)).problems()
            if found:
                raise ConfigError(found[0])
    for signal_name in cfg.train.preempt_signals:
        try:
            signal_number(signal_name)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _schema_groups(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every config group of the schema instance ``node`` (nested ones too), by dotted name."""
    found = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            found += [(f"{prefix}{f.name}", value), *_schema_groups(value, f"{prefix}{f.name}.")]
    return found


def _names_an_option(spec: str) -> bool:
    rng = parse_range(spec)
    return isinstance(rng.low, str) or isinstance(rng.high, str)


def choice_error(key: str, value: Any, allowed: tuple[Any, ...]) -> str | None:
    """The one-line complaint about ``key=value`` when ``value`` is not one of ``allowed`` (None
    among them allows null), with the closest choice by spelling; None when it is allowed."""
    if value in allowed:
        return None
    valid = ", ".join(spelled(a) for a in allowed)
    near = closest(str(value), [spelled(a) for a in allowed if a is not None])
    hint = f"; did you mean {near}? Valid: " if near else "; valid: "
    return f"{key}={_show(value)}: not a valid choice{hint}{valid}"


def check_method_params(name: str, params: dict, prefix: str) -> None:
    """Refuse a parameter of method ``name`` that is not one of its choices (a ``Literal`` field
    of its params dataclass) or outside its declared range; ``prefix`` is how the message names
    it (``method.`` or ``judge.params.<name>.``). A plugin's method is checked the same way."""
    from rredcot_cli.methods import get_method  # deferred: --help

    try:
        spec = get_method(name)
    except KeyError:
        return
    for key, allowed in spec.choices().items():
        problem = choice_error(f"{prefix}{key}", params.get(key), allowed)
        if problem:
            raise ConfigError(problem)
    for key, range_spec in spec.ranges.items():
        body, sep, note = range_spec.partition(";")
        for other in params:  # a bound naming another parameter, shown as the user writes it
            body = re.sub(rf"(?<![\w.]){re.escape(other)}\b", f"{prefix}{other}", body)
        problem = range_error(f"{prefix}{key}", params.get(key), body + sep + note,
                              lambda name: params.get(name.removeprefix(prefix)))
        if problem:
            raise ConfigError(problem)
