"""Run entry points as subprocesses, the way users run them."""
from __future__ import annotations

import os
import subprocess
import sys
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
