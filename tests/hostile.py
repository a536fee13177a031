"""The harness of the hostile-input tests (test_hostile_graph_files, test_hostile_rules, test_hostile_cli): each
case runs ``rlx-egraph`` in its own process, capped at 1.5 GB of address space and 30 s of CPU
(tests/capped_runner.py). Each must end in one ``error:`` line with exit code 2 well inside the caps, write nothing
(the working folder, the home folder and the input's folder hold what they held), and read nothing outside the
input's folder (a weight store named outside it is a FIFO: reading it would never return)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

MEMORY_MB, SECONDS = 1536, 30

# files to write beside the graph (name -> text, bytes, or a function making the bytes)
Files = dict[str, str | bytes | Callable[[], bytes]]
# case -> (its files, the command's arguments after "rlx-egraph" with {graph}, {folder} and {work} filled in, what
# its error line says)
Cases = dict[str, tuple[Files, list[str], str]]


def linear(weights: str | None = None, shape: object = (2, 4), node_id: int = 0, dim: object = None) -> str:
    """A graph JSON of x @ w (+ its weight store's name)."""
    data: dict = {"format": "rlx-egraph-mir", "version": 1, "name": "g", "nodes": [
        {"id": node_id, "op": "Input", "attrs": {"name": "x", "shape": shape if dim is None else [dim, 4]}},
        {"id": node_id + 1, "op": "Param", "attrs": {"name": "w", "shape": [4, 3]}},
        {"id": node_id + 2, "op": "MatMul", "inputs": [node_id, node_id + 1]}], "outputs": [node_id + 2]}
    if weights is not None:
        data["weights"] = weights
    return json.dumps(data)



def zip_bomb(shape: tuple[int, ...]) -> bytes:
    """An .npz whose member 'w' declares f32 ``shape`` and inflates to 1 GB of zeros after its header: about 5 MB,
    deflated at zlib's fastest level (the level changes the compressed bytes, not what they inflate to)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive, \
            archive.open("w.npy", "w", force_zip64=True) as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": shape})
        chunk = bytes(1 << 24)
        for _ in range(64):
            member.write(chunk)
    return buffer.getvalue()


def npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def check_one_clear_error(files: Files, args: list[str], message: str, runner: subprocess.Popen, tmp_path: Path,
                          link: str = "link.npz", prefix: str = "error: ", silent: bool = False) -> None:
    """Run one hostile case in ``runner`` and assert one clear error within the caps that writes nothing.

    ``files`` are written to the input folder, where ``link`` links to a FIFO outside it; ``args`` and ``prefix``
    (how the error line starts) have {graph}, {folder} and {work} filled in; ``silent``: nothing on stdout either."""
    folder, work, logs = tmp_path / "in", tmp_path / "work", tmp_path / "logs"
    home = tmp_path / "home"  # also its user cache, config and data folders and its temporary folder
    for d in (folder, work, logs, home):
        d.mkdir()
    os.mkfifo(tmp_path / "outside.fifo")  # read by nobody: a read of it would block until the wall-time cap
    (folder / link).symlink_to(tmp_path / "outside.fifo")
    for name, content in files.items():
        content = content() if callable(content) else content
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    before = sorted(os.listdir(folder))
    places = {"graph": folder / "g.json", "folder": folder, "work": work}
    runner.stdin.write(json.dumps({"args": [a.format(**places) for a in args], "cwd": str(work), "logs": str(logs),
                                   "home": str(home), "memory_mb": MEMORY_MB, "seconds": SECONDS}) + "\n")
    runner.stdin.flush()
    result = json.loads(runner.stdout.readline())
    lines = result["stderr"].splitlines()
    assert result["code"] == 2, result
    assert len(lines) == 1 and lines[0].startswith(prefix.format(**places)) and message in lines[0], lines
    assert not silent or result["stdout"] == "", result["stdout"]
    assert result["max_rss_mb"] < 1024 and result["wall_seconds"] < SECONDS
    assert os.listdir(work) == [] and os.listdir(home) == [] and sorted(os.listdir(folder)) == before
