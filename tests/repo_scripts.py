"""Load a script of this repository (bench/, scripts/) as a module, for tests of its functions."""

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """``load_script("bench/step_phases.py")`` -> that file as a fresh module (not on sys.path)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
