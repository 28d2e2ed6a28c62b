"""scripts/house_figures.py: function lengths and argument counts read from source (hand-made tree)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "house_figures.py"


def _figures():
    spec = importlib.util.spec_from_file_location("house_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lengths_and_argument_counts_of_functions_and_methods(tmp_path):
    package = tmp_path / "rredcot_cli"
    package.mkdir()
    (package / "a.py").write_text(
        "def f(x, y, *args, z=1, **kwargs):\n"
        "    return x\n"
        "\n"
        "class C:\n"
        "    def m(self, a, /, b):\n"
        "        def inner():\n"
        "            pass\n"
        "        return a\n"
    )
    found = sorted(_figures().functions(package))
    module = f"{package.name}/a.py"  # a path of the hand-made tree, not of the repository
    assert found == [(2, 0, f"{module}:C.m.inner"), (2, 5, f"{module}:f"), (4, 3, f"{module}:C.m")]
