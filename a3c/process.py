"""Setup of every A3C child process (workers and the evaluator), apart from what they run: one module both import,
so that a3c.worker and a3c.evaluate do not import each other."""
from __future__ import annotations

import os
import signal

import torch


def process_setup(nice: int = 0) -> None:
    """Child-process setup: one torch thread (oversubscription is the classic A3C slowdown) and no Ctrl-C.

    The terminal sends SIGINT to the whole process group; the main process alone handles it and stops the children
    through the stop event, so that it can still write the final checkpoint."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    if nice:
        os.nice(nice)
