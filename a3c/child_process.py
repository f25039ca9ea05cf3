"""What every A3C child process (workers and the evaluator) shares apart from what it runs: its setup and the stop
flag it polls; one module both import, so that a3c.worker and a3c.evaluate do not import each other."""
from __future__ import annotations

import multiprocessing as mp
import signal
import time

import torch


def child_context():
    """The multiprocessing context of the workers and the evaluator: children forked from a fork server that has
    imported their code (torch and torchrl) once, where each spawned child imported it again (~4 s of CPU apiece).
    Not a plain fork of the main process: its torch has already run (the shared model), and forking a process whose
    thread pools are up is unsafe. The server is started at the first child, after the main process has set the
    environment its children inherit (``OMP_NUM_THREADS``)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["a3c.supervisor"])  # the workers' and the evaluator's modules, and what they import
    return ctx


def process_setup() -> None:
    """Child-process setup: one torch thread (oversubscription is the classic A3C slowdown) and no Ctrl-C.

    The terminal sends SIGINT to the whole process group; the main process alone handles it and stops the children
    through the :class:`StopFlag`, so that it can still write the final checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)


class StopFlag:
    """The run's stop signal for its child processes, set by the main process and polled by the workers and the
    evaluator. Why not ``multiprocessing.Event``: its ``is_set`` and ``wait`` take a lock shared by every process, and
    a child SIGKILLed inside one of them (a killed evaluator, here) leaves it held for good, so every later ``wait``,
    ``is_set`` and ``set`` blocks: the run could no longer stop. One byte in shared memory, without a lock, cannot be
    left held."""

    POLL_S = 0.01

    def __init__(self, ctx):
        self._flag = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)

    def wait(self, timeout: float) -> bool:
        """Sleep until the flag is set or ``timeout`` seconds have passed; returns whether it is set."""
        deadline = time.monotonic() + timeout
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.POLL_S, left))
        return True
