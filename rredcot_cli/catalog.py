"""What exists, for ``rredcot list``: the credit methods, segmenters, benchmarks and model presets
with one line each, and one of them in full (a method's options; a preset's config file).

Every line comes from where the thing is defined, so nothing here is kept by hand: a method's
summary from its module's docstring and its options from its params dataclass
(``MethodSpec.options()``); a segmenter's from its function's docstring (``SEGMENTERS``); a
benchmark or model preset's from the header comment of its config file (``conf/benchmark/``,
``conf/model/``, the user's config folders included).

Importing this module is cheap (``rredcot --help``); the registries are imported by the functions
that read them (marked "deferred").
"""

from __future__ import annotations

import json
from typing import Any

from rredcot_cli.config.messages import closest
from rredcot_cli.config.search import config_file, group_options
from rredcot_cli.docstrings import comment_summary, doc_summary, first_sentence
from rredcot_cli.errors import ConfigError

KINDS = ("methods", "segmenters", "benchmarks", "models")
_GROUP = {"methods": "method", "segmenters": "segment", "benchmarks": "benchmark", "models": "model"}


def kind_of(text: str) -> str:
    """``text`` as one of KINDS (the singular is accepted too); ConfigError otherwise."""
    kind = text if text in KINDS else f"{text}s"
    if kind in KINDS:
        return kind
    near = closest(text, KINDS)
    hint = f"; did you mean {near}? Valid: " if near else "; valid: "
    raise ConfigError(f"rredcot list {text}: nothing to list by that name{hint}{', '.join(KINDS)}")


def _segmenters() -> list[tuple[str, str]]:
    from rredcot_cli.segmenters import SEGMENTERS  # deferred: --help

    return [(name, first_sentence(doc_summary(SEGMENTERS[name].__doc__))) for name in sorted(SEGMENTERS)]


def _methods() -> list[tuple[str, str]]:
    from rredcot_cli.methods import get_method, method_names  # deferred: --help (imports torch)

    return [(name, get_method(name).summary()) for name in method_names()]


def _preset_summary(group: str, name: str) -> str:
    """The header comment of ``group/name.yaml`` (a model's also names its path)."""
    path = config_file(group, name)
    if path is None:
        return "(a plugin's; no config file)"
    summary = comment_summary(path.read_text())
    if group == "model" and path is not None:
        import yaml  # deferred: --help

        model_path = (yaml.safe_load(path.read_text()) or {}).get("path")
        return f"{summary} (path: {model_path})" if summary else f"path: {model_path}"
    return summary


def entries(kind: str) -> list[tuple[str, str]]:
    """(name, one line) of everything of ``kind`` (one of KINDS), sorted by name."""
    if kind == "methods":
        return _methods()
    if kind == "segmenters":
        return _segmenters()
    group = _GROUP[kind]
    return [(name, _preset_summary(group, name)) for name in group_options().get(group, [])]


def table(rows: list[tuple[str, str]]) -> list[str]:
    """Rows as aligned ``name  text`` lines."""
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{name:<{width}}  {text}".rstrip() for name, text in rows]


def show_value(value: Any) -> str:
    """A default as it is written in an override (``true``, ``null``, ``[a, b]``, a quoted string
    when it holds spaces or newlines)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, str) and (not value or any(c in value for c in " \n\t,'\"{}[]")):
        return json.dumps(value)
    return str(value)


def method_details(name: str) -> list[str]:
    """Method ``name``: its summary, then each option as ``method.KEY=DEFAULT  (type, range)``
    with its meaning below it."""
    from rredcot_cli.methods import get_method, method_names  # deferred: --help (imports torch)

    try:
        spec = get_method(name)
    except KeyError:
        raise _unknown("methods", name, method_names()) from None
    lines = [f"method={name}: {spec.summary()}"]
    options = spec.options()
    if not options:
        return lines + ["  (no options)"]
    lines.append("options (set with method.KEY=VALUE; shown with their defaults):")
    for option in options:
        about = option.type + (f", {option.range}" if option.range else "")
        lines.append(f"  method.{option.name}={show_value(option.default)}  ({about})")
        if option.help:
            lines.append(f"      {option.help}")
    return lines


def preset_details(kind: str, name: str) -> list[str]:
    """A segmenter, benchmark or model preset in full: its config file, comments included."""
    group = _GROUP[kind]
    valid = group_options().get(group, [])
    if name not in valid:
        raise _unknown(kind, name, valid)
    path = config_file(group, name)
    if path is None:  # a plugin benchmark without a config file
        return [f"{group}={name}: {_preset_summary(group, name)}"]
    return [f"# {path}", *path.read_text().rstrip("\n").splitlines()]


def details(kind: str, name: str) -> list[str]:
    return method_details(name) if kind == "methods" else preset_details(kind, name)


def _unknown(kind: str, name: str, valid: list[str]) -> ConfigError:
    near = closest(name, valid)
    hint = f"; did you mean {near}? Valid: " if near else "; valid: "
    return ConfigError(f"no {kind[:-1]} named '{name}'{hint}{', '.join(valid)}")
