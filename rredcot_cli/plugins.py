"""Code from outside the package: credit methods, benchmarks and verifiers of the user's own.

Two ways in, both feeding the same registries as the built-ins (``rredcot_cli.methods.register``,
``rredcot_cli.benchmarks.register_benchmark``):

* **Entry points** of an installed distribution, group ``rredcot.methods`` or
  ``rredcot.benchmarks``; the entry point's name is the option name (``method=NAME``,
  ``benchmark=NAME``), its value ``module:attr``. Names are listed without importing anything;
  a plugin is imported when its name is first looked up.
* **``plugins=[...]``** in the config (or on the command line): Python modules (``pkg.mod``) or
  ``.py`` files, imported when the config is composed; they register with the decorators.

``load_attr("pkg.mod:name")`` fetches one object (e.g. a user verifier). Every failure is one
``PluginError`` line naming what was being loaded. Importing this module imports nothing else.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rredcot_cli.errors import RredcotError, one_line

METHOD_GROUP = "rredcot.methods"
BENCHMARK_GROUP = "rredcot.benchmarks"
_GROUPS = {"method": METHOD_GROUP, "benchmark": BENCHMARK_GROUP}

# Option names registered by modules imported through ``plugins=`` in this process, per config
# group, so the config layer can offer them without a YAML file.
_IMPORTED_OPTIONS: dict[str, set[str]] = {"method": set(), "benchmark": set()}
_IMPORTED: dict[str, Any] = {}  # plugin spec -> module


class PluginError(RredcotError):
    """A plugin could not be imported or does not honour the registry contract (one line)."""


@functools.lru_cache(maxsize=None)
def _entry_points(group: str) -> tuple[Any, ...]:
    """The entry points of ``group`` of the installed distributions (read once per process)."""
    from importlib.metadata import entry_points  # deferred: --help (importlib.metadata takes 30-140 ms to import)

    return tuple(entry_points(group=group))


def entry_point_names(group: str) -> list[str]:
    """Names of the entry points in ``group`` (``rredcot.methods``/``rredcot.benchmarks``), sorted;
    nothing is imported."""
    return sorted({ep.name for ep in _entry_points(group)})


def _describe(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    source = f" of {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point '{ep.name} = {ep.value}' ({ep.group}{source})"


def load_entry_point(group: str, name: str) -> Any:
    """The object entry point ``name`` of ``group`` points at (importing its module)."""
    found = [ep for ep in _entry_points(group) if ep.name == name]
    if not found:
        raise PluginError(f"no entry point named '{name}' in group {group}")
    if len({ep.value for ep in found}) > 1:
        raise PluginError(f"entry points of group {group} give '{name}' twice: "
                          f"{', '.join(ep.value for ep in found)}")
    ep = found[0]
    try:
        return ep.load()
    except Exception as e:  # noqa: BLE001 - any failure of user code becomes one line
        raise PluginError(f"cannot load {_describe(ep)}: {type(e).__name__}: {one_line(e)}") from e


def load_attr(target: str, key: str) -> Any:
    """``pkg.mod:attr`` (attr may be dotted) -> the object; ``key`` is the config key that named
    it (``benchmark.verifier``), for the error line."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{key}={target}: expected module:attr (e.g. my_pkg.rewards:score)")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001
        raise PluginError(f"{key}={target}: cannot import {module_name}: {type(e).__name__}: {one_line(e)}") from e
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{key}={target}: module {module_name} has no attribute '{attr}'")
        obj = getattr(obj, part)
    return obj


def import_module(name: str) -> Any:
    """``importlib.import_module(name)`` with any failure as one ``PluginError`` line."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        raise PluginError(f"plugin '{name}': cannot import it: {type(e).__name__}: {one_line(e)}") from e


def _import_file(path: Path) -> Any:
    name = f"rredcot_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin '{path}': not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001
        del sys.modules[name]
        raise PluginError(f"plugin '{path}': cannot import it: {type(e).__name__}: {one_line(e)}") from e
    return module


def import_plugin(spec: str, registries: dict[str, Any]) -> Any:
    """Import one ``plugins=`` entry, a module name or a ``.py`` file, once per process; the
    names it registers are remembered as options of their groups. ``registries``: group ->
    a function listing that registry's names (``{"method": methods.registered_names, ...}``),
    passed in so this module imports no registry (they import it for their entry points)."""
    if spec in _IMPORTED:
        return _IMPORTED[spec]
    before = {group: set(names()) for group, names in registries.items()}
    if spec.endswith(".py"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise PluginError(f"plugin '{spec}': no such file")
        module = _import_file(path.resolve())
    else:
        module = import_module(spec)
    for group, names in registries.items():
        _IMPORTED_OPTIONS[group] |= set(names()) - before[group]
    _IMPORTED[spec] = module
    return module


def plugin_options(group: str) -> list[str]:
    """Options of config group ``group`` that come from plugins: entry point names and names
    registered by modules imported with ``plugins=`` (nothing is imported here)."""
    if group not in _GROUPS:
        return []
    return sorted(set(entry_point_names(_GROUPS[group])) | _IMPORTED_OPTIONS[group])
