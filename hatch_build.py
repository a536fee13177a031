"""Hatchling build hook: compiles the accelerated modules with Cython when a C compiler works, for wheels and
editable installs, and builds a pure-Python package when none does.

The accelerated modules (``MODULES`` in ``src/rlx_egraph/_accelerators.py``) are Python in Cython's pure-Python
mode.  Each is compiled in place, next to its source under ``src/`` (so an editable install and
``PYTHONPATH=src`` both import it); a wheel carries the extensions as artifacts and is tagged for the platform.
Cython writes its C under ``build/cython``.

When compiling fails for want of a working compiler (or of the Python headers), the hook says so and builds a
``py3-none-any`` wheel of the sources alone: the package runs the same code as Python, with the same results,
more slowly.  Environment:

* ``RLX_EGRAPH_PURE=1``: do not try to compile (a pure-Python wheel);
* ``RLX_EGRAPH_REQUIRE_COMPILED=1``: fail rather than fall back (release wheels: see ``[tool.cibuildwheel]``).

Paths are taken from the project root, wherever the build is started from.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# Compiled for every module: the modules are written for them (no negative index, no index out of range).
DIRECTIVES = {"language_level": 3, "boundscheck": False, "wraparound": False, "initializedcheck": False,
              "cdivision": True, "warn.unreachable": False}


# Cython's utility code (typed memoryviews), compiled once for all the modules rather than into each.
SHARED = "rlx_egraph.engines.egglog._cython_utility"


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class CythonBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root).resolve()
        modules = runpy.run_path(str(root / "src" / "rlx_egraph" / "_accelerators.py"))["MODULES"]
        sources = {name: root / "src" / (name.replace(".", "/") + ".py") for name in (*modules, SHARED)}
        self._remove_extensions(sources)  # a stale extension would shadow its newer source
        if _flag("RLX_EGRAPH_PURE"):
            self.app.display_info("rlx-egraph: RLX_EGRAPH_PURE is set: building without the compiled accelerators")
            return
        try:
            built = self._compile(root, sources)
        except _NoCompiler as exc:
            self._remove_extensions(sources)  # none of a partial build: the modules import each other's C types
            if _flag("RLX_EGRAPH_REQUIRE_COMPILED"):
                raise RuntimeError(f"rlx-egraph: RLX_EGRAPH_REQUIRE_COMPILED is set and the accelerated modules did "
                                   f"not compile (a C compiler and the Python headers are needed): {exc}") from None
            self.app.display_warning(
                f"rlx-egraph: no working C compiler ({exc}); building the pure-Python package, which gives the "
                f"same results more slowly (rlx_egraph.accelerated() is False; see docs/install.md)")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].extend(built)

    @staticmethod
    def _remove_extensions(sources: dict[str, Path]) -> None:
        from importlib.machinery import EXTENSION_SUFFIXES

        for source in sources.values():
            for suffix in EXTENSION_SUFFIXES:
                source.with_suffix(suffix).unlink(missing_ok=True)

    def _compile(self, root: Path, sources: dict[str, Path]) -> list[str]:
        """Compile every module in place; returns the extensions' paths from the root.  Raises :class:`_NoCompiler`
        when the C compiler does not work."""
        from Cython.Build import cythonize
        from setuptools import Extension

        flags = [] if sys.platform == "win32" else ["-O2", "-g0"]  # no debug information: a third of the time
        with tempfile.TemporaryDirectory() as probe:  # before Cython's translation, most of a failed build's time
            self._build([Extension("probe", [_probe_source(Path(probe))], extra_compile_args=flags)], probe)
        with contextlib.chdir(root):  # setuptools resolves paths from the working directory
            extensions = cythonize([*(Extension(name, [str(source)], extra_compile_args=flags)
                                      for name, source in sources.items() if name != SHARED),
                                    Extension(SHARED, [], extra_compile_args=flags)],
                                   build_dir=str(root / "build" / "cython"),  # absolute: Cython caches by path
                                   include_path=[str(root / "src")], compiler_directives=DIRECTIVES, quiet=True,
                                   shared_utility_qualified_name=SHARED)
            build_ext = self._build(extensions)
            return [Path(build_ext.get_ext_fullpath(e.name)).resolve().relative_to(root).as_posix()
                    for e in extensions]

    @staticmethod
    def _build(extensions: list[Any], folder: str | None = None) -> Any:
        """Compile ``extensions`` in place (or into ``folder``); returns setuptools' ``build_ext``.  Raises
        :class:`_NoCompiler` when the C compiler does not work."""
        from setuptools import Distribution
        from setuptools.errors import CompileError, ExecError, LinkError, PlatformError

        dist = Distribution({"ext_modules": extensions, "package_dir": {"": "src"}})
        build_ext = dist.get_command_obj("build_ext")
        build_ext.inplace = folder is None
        if folder is not None:
            build_ext.build_lib = build_ext.build_temp = folder
        build_ext.parallel = os.cpu_count() or 1
        build_ext.ensure_finalized()
        try:
            build_ext.run()
        except (CompileError, ExecError, LinkError, PlatformError) as exc:
            raise _NoCompiler(str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__) from None
        return build_ext


def _probe_source(folder: Path) -> str:
    """A C file that needs what the extensions need (a compiler, a linker and the Python headers)."""
    source = folder / "probe.c"
    source.write_text("#include <Python.h>\nint rlx_egraph_probe(void) { return Py_IsInitialized(); }\n")
    return str(source)


class _NoCompiler(Exception):
    """The C compiler failed (missing, or the Python headers are)."""
