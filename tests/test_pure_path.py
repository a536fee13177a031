"""The pure-Python path (the accelerated modules' sources, run as Python: ``RLX_EGRAPH_PURE=1``, or an install
without a C compiler) gives the compiled path's results: the same graphs and costs on the example models with
both engines, and the extraction and row-reading tests pass on it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlx_egraph import _accelerators, accelerated, examples, optimize_with_report

ROOT = Path(__file__).resolve().parents[1]
MODELS = {**{name: build for name, build in examples.ALL.items()},
          "synthetic": lambda: examples.synthetic(3000, seed=1)}
ENGINES = ("egglog", "fallback")


def _pure_env() -> dict[str, str]:
    return {**os.environ, _accelerators.PURE_VARIABLE: "1"}


def fingerprints() -> dict[str, dict]:
    """Per model and engine, what the run decided: the optimized graph and every figure of the report but its
    timings."""
    out = {}
    for name, build in MODELS.items():
        for engine in ENGINES:
            graph, report = optimize_with_report(build(), engine=engine)
            data = report.to_dict()
            for timed in ("phases", "fallback"):
                data.pop(timed)
            for stage in data["iterations"]:
                stage.pop("seconds")
            out[f"{name}/{engine}"] = {"graph": json.loads(graph.to_json()), "report": data}
    return out


def _fingerprints_in_a_new_process(pure: bool) -> dict[str, dict]:
    """:func:`fingerprints` computed in a new process (no state left by other tests), on the pure-Python path or
    the compiled one."""
    env = _pure_env() if pure else {k: v for k, v in os.environ.items() if k != _accelerators.PURE_VARIABLE}
    script = ("import json, rlx_egraph, test_pure_path as t; "
              f"assert rlx_egraph.accelerated() is {not pure}; print(json.dumps(t.fingerprints()))")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT / "tests", capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.long
def test_the_pure_path_optimizes_the_example_models_as_the_compiled_path_does() -> None:
    if not accelerated():
        pytest.fail("this suite runs on an install whose accelerators compiled (make test builds them)")
    pure, compiled = _fingerprints_in_a_new_process(pure=True), _fingerprints_in_a_new_process(pure=False)
    assert sorted(pure) == sorted(compiled) == sorted(f"{m}/{e}" for m in MODELS for e in ENGINES)
    for key in compiled:
        assert pure[key] == compiled[key], key
    fused = {key: v["report"]["fused_op_counts"] for key, v in compiled.items()}
    assert any(counts for counts in fused.values())  # the models did fuse: the comparison covers real decisions


def _pytest(tests: str, env: dict[str, str]) -> tuple[int, int | None, str]:
    """Run pytest on ``tests`` (a file of this folder) in a new process: its exit code, the number of tests it
    collected (its header's ``collected N items``) and its summary line."""
    run = subprocess.run([sys.executable, "-m", "pytest", tests, "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-o", "addopts="], cwd=ROOT / "tests", capture_output=True, text=True, env=env)
    collected = re.search(r"^collected (\d+) items?$", run.stdout, flags=re.MULTILINE)
    lines = run.stdout.strip().splitlines()
    summary = lines[-1].strip("= ") if lines else run.stderr[-3000:]
    return run.returncode, int(collected.group(1)) if collected else None, summary


@pytest.mark.long
@pytest.mark.parametrize("tests", ["test_extract.py", "test_rows.py"])
def test_the_extraction_and_row_tests_pass_on_the_pure_path(tests: str) -> None:
    """Every test the file collects passes on the pure path (one process: its header gives the count)."""
    code, collected, summary = _pytest(tests, env=_pure_env())
    assert code == 0 and collected, summary
    assert re.fullmatch(rf"{collected} passed in [\d.]+s( \([\d:]+\))?", summary), summary
