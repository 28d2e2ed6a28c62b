"""Load a script of this repository (bench/, scripts/) as a module, for tests of its functions."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> ModuleType:
    """``load_script("bench/step_phases.py")`` -> that file as a fresh module (not on sys.path)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    # as `python bench/x.py` runs it: the script's own folder first on sys.path, so that its
    # `from measure import ...` finds bench/measure.py
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module
