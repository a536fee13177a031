"""Suite-wide settings: property tests draw the same examples on every run (the suite is CI's gate and must
give the same verdict twice); ``HYPOTHESIS_PROFILE=explore pytest ...`` draws new random examples instead.
Calibrations are looked up in a cache directory that does not exist, so the onnxruntime target is the shipped
one whatever ``rlx-egraph calibrate`` cached on the machine (tests that need a cache set their own).
Byte code is written (to the ``__pycache__`` folders git ignores) even where the environment turns that off
(``PYTHONDONTWRITEBYTECODE``): every process the suite starts (the xdist workers, CLI and pure-path subprocesses,
notebook kernels) would otherwise compile the package, and pytest rewrite the test modules' asserts, again."""

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from rlx_egraph.cost.calibration import CACHE_ENV

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ[CACHE_ENV] = os.path.join(tempfile.gettempdir(), f"rlx-egraph-tests-{os.getpid()}-no-cache")

sys.dont_write_bytecode = False  # before xdist starts its workers: they inherit the environment
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``long`` first, each group in collection order: xdist hands tests out in collection order,
    and a long test handed out last would run alone while the other workers wait."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="module")
def runner() -> Iterator[subprocess.Popen]:
    """A process that runs jobs under memory and time caps (tests/capped_runner.py), for the hostile-input tests."""
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "capped_runner.py")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    yield process
    process.stdin.close()
    process.wait(timeout=60)
