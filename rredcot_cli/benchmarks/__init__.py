"""The benchmark registry: name -> ``"module:Class"``, imported only when the benchmark is made.

Synthetic benchmarks (``chain``, ``chain_verbose``, ``chain_tail``, ``search``) are generated from ``(min_steps, max_steps,
data_seed)`` and can check each step; real ones (``gsm8k``, ``math500``) read a data file
(``path``, see ``rredcot_cli.data``) and check the final answer with math-verify under
``verify_timeout_s``; ``jsonl`` reads any question/answer file with a configurable answer
extractor and verifier (``rredcot_cli.benchmarks.jsonl``).

Benchmarks from outside the package: a class (or factory) registered with
``@register_benchmark(name)`` in a module imported by ``plugins=[...]``, or named by an entry
point of group ``rredcot.benchmarks`` (``name = "pkg.mod:Class"``, the same form as
``BENCHMARKS``). Every benchmark is built the same way: its constructor gets, by keyword, the
``benchmark.*`` settings its signature names, plus ``benchmark.options``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable

from rredcot_cli.benchmarks.base import Benchmark, Problem, StepCheckedBenchmark
from rredcot_cli.errors import RredcotError
from rredcot_cli.plugins import BENCHMARK_GROUP, PluginError, entry_point_names, load_entry_point

if TYPE_CHECKING:
    from rredcot_cli.config.schema import BenchmarkConfig

BENCHMARKS: dict[str, str] = {
    "chain": "rredcot_cli.benchmarks.synthetic:ChainBenchmark",
    "chain_verbose": "rredcot_cli.benchmarks.synthetic:ChainVerboseBenchmark",
    "chain_tail": "rredcot_cli.benchmarks.synthetic:ChainTailBenchmark",
    "search": "rredcot_cli.benchmarks.synthetic:SearchBenchmark",
    "gsm8k": "rredcot_cli.benchmarks.gsm8k:GSM8KBenchmark",
    "math500": "rredcot_cli.benchmarks.math500:MATH500Benchmark",
    "jsonl": "rredcot_cli.benchmarks.jsonl:JSONLBenchmark",
    "arith": "rredcot_cli.benchmarks.jsonl:ArithBenchmark",
}
SYNTHETIC_BENCHMARKS = frozenset({"chain", "chain_verbose", "chain_tail", "search"})

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkOptionError",
    "Problem",
    "StepCheckedBenchmark",
    "benchmark_names",
    "make_benchmark",
    "register_benchmark",
]


class BenchmarkOptionError(RredcotError, ValueError):
    """An unknown benchmark name or an option its kind does not take (one line for the CLI)."""


_REGISTERED: dict[str, Callable[..., Benchmark]] = {}  # by @register_benchmark (plugins)


def register_benchmark(name: str) -> Callable:
    """Register a benchmark class (or factory returning a ``Benchmark``) as ``name``, for
    ``benchmark=name``; its constructor's keyword parameters are the ``benchmark.*`` settings it
    takes (see ``make_benchmark``)."""

    def decorator(factory: Callable[..., Benchmark]) -> Callable[..., Benchmark]:
        if name in BENCHMARKS or (name in _REGISTERED and _REGISTERED[name] is not factory):
            raise ValueError(f"benchmark {name!r} is registered twice")
        _REGISTERED[name] = factory
        return factory

    return decorator


def registered_names() -> list[str]:
    """Built-in benchmarks and those registered so far in this process (no import)."""
    return sorted(set(BENCHMARKS) | set(_REGISTERED))


def benchmark_names() -> list[str]:
    """Built-in, registered and entry-point benchmark names, sorted (nothing is imported)."""
    return sorted(set(registered_names()) | set(entry_point_names(BENCHMARK_GROUP)))


def _load_class(name: str) -> Callable[..., Benchmark]:
    if name in BENCHMARKS:
        module_name, _, class_name = BENCHMARKS[name].partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    if name in _REGISTERED:
        return _REGISTERED[name]

    if name not in entry_point_names(BENCHMARK_GROUP):
        raise BenchmarkOptionError(f"unknown benchmark {name!r}; valid: {', '.join(benchmark_names())}")
    factory = load_entry_point(BENCHMARK_GROUP, name)
    if not callable(factory):
        raise PluginError(f"entry point '{name}' of group {BENCHMARK_GROUP} is not a class or factory: {factory!r}")
    return factory


def _keywords(factory: Callable, name: str, settings: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The settings ``factory`` takes (by its signature) plus ``options``; an option it does not
    take, or a ``path`` for a benchmark without one, is a BenchmarkOptionError."""
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    accepted = {k for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if settings.get("path") is not None and "path" not in accepted and not takes_any:
        raise BenchmarkOptionError(f"benchmark {name} is generated, it takes no path (got benchmark.path={settings['path']!r})")
    for key in options:
        if key not in accepted and not takes_any:
            raise BenchmarkOptionError(f"benchmark {name} takes no option '{key}' (benchmark.options.{key}); "
                                       f"its options: {', '.join(sorted(accepted)) or 'none'}")
    chosen = {k: v for k, v in settings.items() if takes_any or k in accepted}
    return {**chosen, **options}


def benchmark_from_settings(settings: BenchmarkConfig) -> Benchmark:
    """The benchmark of the typed ``benchmark.*`` settings: every field but the name and the splits
    goes to ``make_benchmark``, which hands each constructor the ones it takes."""
    fields = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
              if f.name not in ("name", "train_split", "eval_split")}
    return make_benchmark(settings.name, **fields)


def make_benchmark(
    name: str,
    *,
    path: str | None = None,
    min_steps: int = 4,
    max_steps: int = 12,
    data_seed: int = 1234,
    verify_timeout_s: float = 5.0,
    options: dict[str, Any] | None = None,
    **settings: Any,
) -> Benchmark:
    """The benchmark called ``name``, built with the settings its constructor takes.

    Every keyword (``path``, ``min_steps``, ..., and other ``benchmark.*`` settings such as
    ``answer_regex``) goes to the constructor if its signature names it (or takes ``**kwargs``);
    ``options`` (``benchmark.options``, for user benchmarks) always goes, and a key the
    constructor does not take is an error. So synthetic benchmarks get ``min_steps``,
    ``max_steps`` and ``data_seed``; real ones ``path`` (None: the packaged copy) and
    ``verify_timeout_s``. Unknown names, and a ``path`` for a benchmark that takes none, raise
    BenchmarkOptionError (a ValueError and a RredcotError); a plugin that fails to import,
    ``PluginError``.
    """
    if name not in BENCHMARKS and name not in _REGISTERED and name not in benchmark_names():
        raise BenchmarkOptionError(f"unknown benchmark {name!r}; valid: {', '.join(benchmark_names())}")
    factory = _load_class(name)
    settings = dict(settings, path=path, min_steps=min_steps, max_steps=max_steps, data_seed=data_seed,
                    verify_timeout_s=verify_timeout_s)
    benchmark = factory(**_keywords(factory, name, settings, dict(options or {})))
    if name not in BENCHMARKS:
        missing = [a for a in ("name", "load", "prompt", "extract_answer", "verify") if not hasattr(benchmark, a)]
        if missing:
            raise BenchmarkOptionError(f"benchmark {name} ({factory!r}) lacks {', '.join(missing)} "
                                       f"of the Benchmark contract (rredcot_cli.benchmarks.base)")
        if benchmark.name != name:  # samples record it, and reruns rebuild the benchmark by it
            raise BenchmarkOptionError(f"benchmark {name}: its object's name is {benchmark.name!r}; "
                                       f"set the class attribute name = {name!r}")
    return benchmark
