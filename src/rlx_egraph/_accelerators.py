"""The compiled accelerators: which modules have one, and the switch that turns them off.

The modules listed in :data:`MODULES` are Python (Cython's pure-Python mode: type annotations and decorators
that Cython compiles, with a ``.pxd`` beside a module whose classes other modules read at C speed).  An install
with a working C compiler builds each into an extension module next to its source (``hatch_build.py``), which
Python then imports instead of the source; without a compiler the sources run as they are, with the same
results, more slowly.  ``RLX_EGRAPH_PURE=1`` in the environment makes a process import the sources even where
the extensions are built (set before ``rlx_egraph`` is first imported).

This module imports nothing from the package: ``hatch_build.py`` reads :data:`MODULES` from it at build time.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_VARIABLE = "RLX_EGRAPH_PURE"

# The accelerated modules, compiled in this order (a module after those it cimports).
MODULES = (
    "rlx_egraph.egraph._rows",  # egglog's rows read into the view's e-nodes and e-classes
    "rlx_egraph.egraph._flat",  # the e-graph as integer arrays; the heap and memo keys the passes share
    "rlx_egraph.egraph._typecheck",  # the view's type propagation and input-node tagging
    "rlx_egraph.egraph._pricing",  # per e-node cost
    "rlx_egraph.egraph._choice",  # extraction's bottom-up passes and choice arrays
    "rlx_egraph.egraph._decoding",  # decode's order and node loop
    "rlx_egraph.egraph._solver",  # greedy extraction's local search
)


def pure_requested() -> bool:
    """Whether the environment asks for the pure-Python path (``RLX_EGRAPH_PURE`` set, and not to ``0``)."""
    return os.environ.get(PURE_VARIABLE, "") not in ("", "0")


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the accelerated modules' ``.py`` sources ahead of their compiled extensions."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        name = fullname.rpartition(".")[2]
        for folder in path or ():
            source = Path(folder) / f"{name}.py"
            if source.is_file():
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def install() -> None:
    """Import the sources rather than the extensions in this process if :func:`pure_requested` (run when this
    module is imported, which ``rlx_egraph/__init__.py`` does first)."""
    if pure_requested() and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


def accelerated() -> bool:
    """True when this process runs the compiled accelerators, False when it runs their pure-Python sources (no
    compiler at install, or ``RLX_EGRAPH_PURE=1``).  Both give the same results; see ``docs/install.md``."""
    return all(importlib.import_module(name).COMPILED for name in MODULES)


install()
