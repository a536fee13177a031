"""Hatchling build hook: compiles the Cython extension modules into the package, for wheels and editable installs.

The extension is built in place (next to its ``.pyx`` under ``src/``), so an editable install and
``PYTHONPATH=src`` both import it; a wheel carries it as an artifact.  Cython writes its C++ under
``build/cython``.  Paths are taken from the project root, wherever the build is started from.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

EXTENSIONS = {"rlx_egraph.egraph._solver": "src/rlx_egraph/egraph/_solver.pyx",
              "rlx_egraph.egraph._rows": "src/rlx_egraph/egraph/_rows.pyx"}


class CythonBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        from Cython.Build import cythonize
        from setuptools import Distribution, Extension
        from setuptools.errors import CompileError, ExecError, LinkError, PlatformError

        root = Path(self.root).resolve()
        with contextlib.chdir(root):  # setuptools resolves paths from the working directory
            modules = cythonize([Extension(name, [str(root / source)], extra_compile_args=["-O2"])
                                 for name, source in EXTENSIONS.items()],
                                build_dir=str(root / "build" / "cython"),  # absolute: Cython caches by path
                                include_path=[str(root / "src")], quiet=True)  # finds _rows.pxd for _solver
            dist = Distribution({"ext_modules": modules, "package_dir": {"": "src"}})
            build_ext = dist.get_command_obj("build_ext")
            build_ext.inplace = True
            build_ext.ensure_finalized()
            try:
                build_ext.run()
            except (CompileError, ExecError, LinkError, PlatformError) as exc:
                raise RuntimeError(f"rlx-egraph compiles two Cython modules (egglog's rows read as integers, the "
                                   f"passes over the e-graph) and needs a C++ compiler and the Python headers for "
                                   f"them (Debian: apt-get install g++ python3-dev): {exc}") from None
            built = [Path(build_ext.get_ext_fullpath(m.name)).resolve().relative_to(root).as_posix() for m in modules]
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"].extend(built)
