"""The wheel: built by hatchling with the Cython hook, it carries the compiled extraction module and the rules."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_carries_the_compiled_module_and_the_shipped_rules(tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    source = tmp_path / "src-copy"  # a clean copy: the hook compiles in place
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    (wheel,) = WheelBuilder(str(source)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    names = zipfile.ZipFile(wheel).namelist()
    compiled = [n for n in names if n.startswith("rlx_egraph/egraph/_solver.") and n.endswith((".so", ".pyd"))]
    assert len(compiled) == 1, names
    assert "rlx_egraph/shipped_rules/norms.egg" in names
    assert not any(n.endswith((".cpp", ".c")) for n in names)
    assert "-py3-none-any" not in Path(wheel).name  # a platform wheel, since it holds compiled code
