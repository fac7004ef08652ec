"""Test helper: a script of ``benchmarks/`` (not a package) imported as a module, once per pytest run: the folder is
put on ``sys.path`` as running a script there does, so the scripts import each other by name (``import ledger``)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as the module ``name`` (the name its sibling scripts import it by)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)
