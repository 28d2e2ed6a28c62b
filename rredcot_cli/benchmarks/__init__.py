"""The benchmark registry: name -> ``"module:Class"``, imported only when the benchmark is made.

Synthetic benchmarks (``chain``, ``chain_verbose``, ``search``) are generated from ``(min_steps, max_steps,
data_seed)`` and can check each step; real ones (``gsm8k``, ``math500``) read a data file
(``path``, see ``rredcot_cli.data``) and check the final answer with math-verify under
``verify_timeout_s``.
"""

from __future__ import annotations

import importlib

from rredcot_cli.benchmarks.base import Benchmark, Problem, StepCheckedBenchmark
from rredcot_cli.errors import RredcotError

BENCHMARKS: dict[str, str] = {
    "chain": "rredcot_cli.benchmarks.synthetic:ChainBenchmark",
    "chain_verbose": "rredcot_cli.benchmarks.synthetic:ChainVerboseBenchmark",
    "search": "rredcot_cli.benchmarks.synthetic:SearchBenchmark",
    "gsm8k": "rredcot_cli.benchmarks.gsm8k:GSM8KBenchmark",
    "math500": "rredcot_cli.benchmarks.math500:MATH500Benchmark",
}
SYNTHETIC_BENCHMARKS = frozenset({"chain", "chain_verbose", "search"})

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "BenchmarkOptionError",
    "Problem",
    "StepCheckedBenchmark",
    "benchmark_names",
    "make_benchmark",
]


class BenchmarkOptionError(RredcotError, ValueError):
    """An unknown benchmark name or an option its kind does not take (one line for the CLI)."""


def benchmark_names() -> list[str]:
    """Registered benchmark names, sorted."""
    return sorted(BENCHMARKS)


def _load_class(name: str) -> type:
    module_name, _, class_name = BENCHMARKS[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def make_benchmark(
    name: str,
    *,
    path: str | None = None,
    min_steps: int = 4,
    max_steps: int = 12,
    data_seed: int = 1234,
    verify_timeout_s: float = 5.0,
) -> Benchmark:
    """The benchmark called ``name``, given the options that apply to its kind.

    Synthetic benchmarks get ``min_steps``, ``max_steps`` and ``data_seed``; real ones get
    ``path`` (None: the packaged copy) and ``verify_timeout_s``. Unknown names, and a ``path``
    for a synthetic benchmark, raise BenchmarkOptionError (a ValueError and a RredcotError).
    """
    if name not in BENCHMARKS:
        raise BenchmarkOptionError(f"unknown benchmark {name!r}; valid: {', '.join(benchmark_names())}")
    cls = _load_class(name)
    if name in SYNTHETIC_BENCHMARKS:
        if path is not None:
            raise BenchmarkOptionError(f"benchmark {name} is generated, it takes no path (got benchmark.path={path!r})")
        return cls(min_steps=min_steps, max_steps=max_steps, data_seed=data_seed)
    return cls(path=path, verify_timeout_s=verify_timeout_s)
