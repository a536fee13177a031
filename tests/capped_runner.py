"""Runs ``rlx-egraph`` commands for the hostile-input tests, each in a forked child capped in memory and time.

Started once per test module (``python tests/capped_runner.py``): it imports the CLI once, then reads one JSON
request per line on stdin, ``{"args": [...], "cwd": dir, "logs": dir, "home": dir, "memory_mb": n, "seconds": s}``,
runs ``main(args)`` in a child process with its address space limited to ``memory_mb`` and its CPU time to
``seconds`` (killed after twice that in wall time), working in ``cwd`` with its stdout and stderr written to files
in ``logs``, and ``home`` as its home, user cache, config and data folders and its temporary folder (so a test sees
what it writes there),
and answers one JSON line: ``{"code", "stdout", "stderr", "max_rss_mb", "wall_seconds"}`` (``code`` the exit code,
or minus the signal that ended the child).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time

import rlx_egraph.onnx  # noqa: F401  (imported once here: each child starts with it loaded)
from rlx_egraph.cli.main import main


def run(request: dict) -> dict:
    logs = request["logs"]
    out_path, err_path = os.path.join(logs, "stdout"), os.path.join(logs, "stderr")
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: caps, then the command
        try:
            cap = request["memory_mb"] << 20
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            resource.setrlimit(resource.RLIMIT_CPU, (request["seconds"], request["seconds"] + 1))
            os.chdir(request["cwd"])
            for var in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "TMPDIR"):
                os.environ[var] = request["home"]
            tempfile.tempdir = request["home"]
            for fd, path in ((1, out_path), (2, err_path)):
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
            code = main(request["args"])
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # a crash past main's own handling: report it as such
            code = 99
        os._exit(code)
    deadline = start + 2 * request["seconds"]
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            os.kill(pid, signal.SIGKILL)
            done, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.01)
    code = os.waitstatus_to_exitcode(status)
    with open(out_path) as out, open(err_path) as err:
        return {"code": code, "stdout": out.read(), "stderr": err.read(), "max_rss_mb": usage.ru_maxrss / 1024,
                "wall_seconds": time.perf_counter() - start}


if __name__ == "__main__":
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)
