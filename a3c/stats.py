"""Run statistics in shared memory, written by the workers and the evaluator, read by worker 0 (which logs) and by
the main process (progress bar, checkpoints, summary).

Every table has exactly one writer (a worker writes only its own row; the evaluator only the eval ring and the
frames it is evaluating, which the supervisor clears once the evaluator has died), and every
row has a lock that its writer holds while it writes and a reader while it reads: the lock's release and acquire
order the stores, so a reader that sees a new episode count also sees that episode's row, on any CPU (plain stores
to shared memory are only ordered so on x86). A worker killed with SIGKILL while it holds its lock (a window of
microseconds) must not freeze the run: waiting for a lock gives up after ``LOCK_TIMEOUT_S`` and goes on without it,
as before there were locks.
"""
from __future__ import annotations

import contextlib

import torch

from a3c.child_process import child_context

LOCK_TIMEOUT_S = 1.0

FRAMES, UPDATES, EPISODES, EVAL_WAIT_MS = range(4)
NOT_EVALUATING = -1


class SharedStats:
    """Per-worker counters and episode rings, an evaluation ring, the evaluation in progress, and the final
    evaluation."""

    def __init__(self, workers: int, episode_capacity: int = 1024, eval_capacity: int = 1024):
        # per worker: frames, updates, episodes, and milliseconds spent waiting for a late evaluation
        self.counters = torch.zeros(workers, 4, dtype=torch.int64).share_memory_()
        self.resumed = torch.zeros(4, dtype=torch.int64).share_memory_()  # counts carried over from a checkpoint
        # per worker: (score, length, frames when it ended)
        self.episodes = torch.zeros(workers, episode_capacity, 3, dtype=torch.float64).share_memory_()
        # (frames of the evaluated weights, mean return, std, episodes, frames when its result came); evals_written
        # counts rows
        self.evals = torch.zeros(eval_capacity, 5, dtype=torch.float64).share_memory_()
        self.evals_written = torch.zeros((), dtype=torch.int64).share_memory_()
        # the frames of the weights being evaluated now (NOT_EVALUATING: none), read by the workers on every rollout
        self.evaluating = torch.full((), NOT_EVALUATING, dtype=torch.int64).share_memory_()
        # (done flag, frames, mean return, std, episodes), written once by worker 0 at the end
        self.final_eval = torch.zeros(5, dtype=torch.float64).share_memory_()
        ctx = child_context()  # the workers' context: the locks travel to them with this object
        self.locks = [ctx.Lock() for _ in range(workers)]  # one per worker row
        self.eval_lock = ctx.Lock()  # the eval ring and the final evaluation

    @staticmethod
    @contextlib.contextmanager
    def _holding(lock):
        got = lock.acquire(timeout=LOCK_TIMEOUT_S)  # False only if a killed process died holding it
        try:
            yield
        finally:
            if got:
                lock.release()

    # --- writers (each called only by the owner of the row) -------------------------------------------------------
    def add_progress(self, rank: int, frames: int, updates: int) -> None:
        with self._holding(self.locks[rank]):
            self.counters[rank, FRAMES] += frames
            self.counters[rank, UPDATES] += updates

    def add_episode(self, rank: int, score: float, length: int) -> None:
        row = torch.tensor([score, length, float(self.frames)], dtype=torch.float64)
        with self._holding(self.locks[rank]):
            n = int(self.counters[rank, EPISODES])
            ring = self.episodes[rank]
            ring[n % len(ring)] = row
            self.counters[rank, EPISODES] += 1

    def add_eval_wait(self, rank: int, seconds: float) -> None:
        with self._holding(self.locks[rank]):
            self.counters[rank, EVAL_WAIT_MS] += round(seconds * 1000)

    def start_eval(self, frames: int) -> None:
        """The evaluator took the weights at ``frames`` and plays them now."""
        self.evaluating.fill_(frames)

    def add_eval(self, frames: int, mean: float, std: float, episodes: int) -> None:
        """The result of the evaluation of the weights at ``frames``; it came at the current frame count."""
        row = torch.tensor([frames, mean, std, episodes, self.frames_unlocked], dtype=torch.float64)
        with self._holding(self.eval_lock):
            n = int(self.evals_written)
            self.evals[n % len(self.evals)] = row
            self.evals_written += 1
        self.evaluating.fill_(NOT_EVALUATING)

    def end_eval(self) -> None:
        """No evaluation in progress any more (stopped, or its process died): nobody waits for it."""
        self.evaluating.fill_(NOT_EVALUATING)

    def eval_behind(self, interval: int) -> bool:
        """Whether training has reached the end of the interval the evaluated weights are in (then the workers wait,
        so a result comes at most one interval after its weights, and the next evaluation starts inside the next
        interval: none is skipped). Waiting a whole interval past the weights instead let each evaluation start the
        rollouts in flight later than the last, until one interval went unevaluated."""
        evaluating = int(self.evaluating)
        return evaluating != NOT_EVALUATING and self.frames_unlocked >= (evaluating // interval + 1) * interval

    def set_final_eval(self, frames: int, mean: float, std: float, episodes: int) -> None:
        with self._holding(self.eval_lock):
            self.final_eval.copy_(torch.tensor([1.0, frames, mean, std, episodes], dtype=torch.float64))

    def restore(self, frames: int, updates: int, episodes: int) -> None:
        """Continue a resumed run's counters (call before any worker starts)."""
        self.resumed.copy_(torch.tensor([frames, updates, episodes, 0]))

    # --- readers ----------------------------------------------------------------------------------------------------
    def _rows(self) -> torch.Tensor:
        """Every worker's counters, each row read under its lock."""
        rows = []
        for rank, lock in enumerate(self.locks):
            with self._holding(lock):
                rows.append(self.counters[rank].clone())
        return torch.stack(rows)

    @property
    def frames(self) -> int:
        return int(self._rows()[:, FRAMES].sum() + self.resumed[FRAMES])

    @property
    def frames_unlocked(self) -> int:
        """The frame count read without the row locks: what the evaluator polls (20 times a second) and schedules
        by, so that a SIGKILL there never leaves a worker's row lock held (every later access to that row would wait
        out ``LOCK_TIMEOUT_S``). Each counter is one aligned 8-byte word, so a read sees an old or a new count."""
        return int(self.counters[:, FRAMES].sum() + self.resumed[FRAMES])

    def snapshot(self) -> dict[str, int]:
        frames, updates, episodes, _ = (self._rows().sum(0) + self.resumed).tolist()
        with self._holding(self.eval_lock):
            evals = int(self.evals_written)
        return {"frames": frames, "updates": updates, "episodes": episodes, "evals": evals}

    def episodes_since(self, seen: list[int]) -> list[tuple[int, float, float, float]]:
        """Episodes finished since ``seen`` (per-worker counts, updated in place) as ``(rank, score, length, frames)``."""
        rows = []
        for rank, ring in enumerate(self.episodes):
            with self._holding(self.locks[rank]):
                total = int(self.counters[rank, EPISODES])
                for i in range(max(seen[rank], total - len(ring)), total):  # older than one lap of the ring: gone
                    score, length, frames = ring[i % len(ring)].tolist()
                    rows.append((rank, score, length, frames))
            seen[rank] = total
        return sorted(rows, key=lambda row: row[3])

    def evals_since(self, seen: int) -> tuple[list[tuple[float, float, float, float, float]], int]:
        """Evaluations recorded after the first ``seen`` ones as ``(frames, mean, std, episodes, result_frames)``, and
        the count."""
        with self._holding(self.eval_lock):
            total = int(self.evals_written)
            first = max(seen, total - len(self.evals))
            return [tuple(self.evals[i % len(self.evals)].tolist()) for i in range(first, total)], total

    def updates_per_worker(self) -> list[int]:
        """Optimiser steps each worker has made in this session (not counting a resumed run's)."""
        return [int(c) for c in self._rows()[:, UPDATES]]

    def eval_wait_s(self) -> list[float]:
        """Seconds each worker has waited for a late evaluation in this session."""
        return [int(c) / 1000 for c in self._rows()[:, EVAL_WAIT_MS]]

    def episode_counts(self) -> list[int]:
        """Episodes finished so far by each worker (the ``seen`` of :meth:`episodes_since`)."""
        return [int(c) for c in self._rows()[:, EPISODES]]

    def recent_scores(self, n: int = 20) -> list[float]:
        """The scores of the last ``n`` episodes (by frame count) over all workers."""
        seen = [max(0, c - n) for c in self.episode_counts()]
        return [row[1] for row in self.episodes_since(seen)[-n:]]

    def final_evaluation(self) -> dict[str, float] | None:
        with self._holding(self.eval_lock):
            done, frames, mean, std, episodes = self.final_eval.tolist()
        return {"frames": frames, "return": mean, "return_std": std, "episodes": episodes} if done else None
