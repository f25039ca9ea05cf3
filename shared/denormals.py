"""Subnormal floats (|x| < 1.18e-38) read and written as zero in the learner's arithmetic (x86 FTZ/DAZ).

Why: Adam's first moment of a weight whose gradient is mostly zero (a ReLU unit that rarely fires) decays by beta1 each
step through the subnormal range, and x86 arithmetic on a subnormal takes a microcode assist: in a TD3 run a large
share of a critic layer's ``exp_avg`` goes subnormal and its Adam step becomes several times slower (docs/results.md,
"Off-policy engine", the default command). TensorFlow and XLA flush subnormals on the CPU by default; values that small
change no update measurably.

``torch.set_flush_denormal`` sets the flag for the calling thread only. A thread started later inherits its creator's
floating-point environment (POSIX), so :func:`start_intra_op_threads` starts torch's intra-op threads (OpenMP, which MKL
shares) with the flag on, where they keep it; the main thread sets it only inside :func:`flushing` (the learner's
updates), so the envs, the collection policy and the evaluations compute as they would anywhere else.
"""
from __future__ import annotations

import contextlib

import torch

GRAIN = 32768  # at::internal::GRAIN_SIZE: torch splits an elementwise op over its threads in chunks of at least this


def start_intra_op_threads(threads: int) -> None:
    """Set torch's intra-op threads to ``threads`` and start them flushing subnormals. Threads that had started before
    in this process (a run from Python after other torch work, a test) keep their setting: the learner is only slower
    there, and :func:`every_thread_flushes` tells."""
    torch.set_num_threads(threads)
    with flushing():
        torch.zeros(GRAIN * threads * 4).add_(1.0)  # an op large enough to run on every thread: starts them


@contextlib.contextmanager
def flushing():
    """Subnormals flushed on the calling thread inside the block (its threads started by :func:`start_intra_op_threads`
    flush always)."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def every_thread_flushes() -> bool:
    """Whether an op spread over all of torch's intra-op threads flushes subnormals inside :func:`flushing` (False too
    where the CPU cannot flush)."""
    n = GRAIN * torch.get_num_threads() * 4
    smallest = torch.ones(n, dtype=torch.int32).view(torch.float32)  # 1.4e-45, written as bits
    with flushing():
        return bool(((smallest * 1.0) == 0).all())
