"""Run entry points as subprocesses, the way users run them."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent


def module_cmd(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_module(module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``python -m module args...`` to completion from the repo root."""
    return subprocess.run(module_cmd(module, *args), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def start_module(module: str, *args: str, log: Path) -> subprocess.Popen:
    """Start ``python -m module args...`` in its own process group (so a test can send it a Ctrl-C)."""
    return subprocess.Popen(module_cmd(module, *args), cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def alive(pids) -> list[int]:
    """The pids that still run (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


RAY_PROCESS_NAMES = ("raylet", "gcs_server")


def _in_this_session(process: psutil.Process) -> bool:
    """Whether a Ray process belongs to a cluster of this test session: its command line (raylet, gcs_server) or the
    log files it holds open (every Ray process, the Python ones rename themselves) lie under the session's
    ``RAY_TMPDIR`` (tests/conftest.py). Another Ray job on the machine is not ours to judge."""
    root = os.environ["RAY_TMPDIR"]
    try:
        return (any(root in part for part in process.cmdline())
                or any(f.path.startswith(root) for f in process.open_files()))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def ray_processes() -> list[str]:
    """Names of this test session's Ray processes still running (a finished run must leave none)."""
    names = []
    for p in psutil.process_iter(["name", "status"]):
        name = p.info["name"] or ""
        if (p.info["status"] != psutil.STATUS_ZOMBIE and (name in RAY_PROCESS_NAMES or name.startswith("ray::"))
                and _in_this_session(p)):
            names.append(name)
    return names


def wait_no_ray(timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return ray_processes()
