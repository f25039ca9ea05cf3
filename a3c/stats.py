"""Run statistics in shared memory, written by the workers and the evaluator, read by worker 0 (which logs) and by
the main process (progress bar, checkpoints, summary).

Every table has exactly one writer (a worker writes only its own row; the evaluator only the eval ring) and no lock:
a worker killed with SIGKILL mid-write must not leave a lock held that would freeze the rest of the run.
"""
from __future__ import annotations

import torch

FRAMES, UPDATES, EPISODES = range(3)


class SharedStats:
    """Per-worker counters and episode rings, an evaluation ring, and the final evaluation."""

    def __init__(self, workers: int, episode_capacity: int = 1024, eval_capacity: int = 1024):
        self.counters = torch.zeros(workers, 3, dtype=torch.int64).share_memory_()
        self.resumed = torch.zeros(3, dtype=torch.int64).share_memory_()  # counts carried over from a checkpoint
        # per worker: (score, length, frames when it ended)
        self.episodes = torch.zeros(workers, episode_capacity, 3, dtype=torch.float64).share_memory_()
        # (frames, mean return, std, episodes); evals_written counts rows
        self.evals = torch.zeros(eval_capacity, 4, dtype=torch.float64).share_memory_()
        self.evals_written = torch.zeros((), dtype=torch.int64).share_memory_()
        # (done flag, frames, mean return, std, episodes), written once by worker 0 at the end
        self.final_eval = torch.zeros(5, dtype=torch.float64).share_memory_()

    # --- writers (each called only by the owner of the row) -------------------------------------------------------
    def add_progress(self, rank: int, frames: int, updates: int) -> None:
        self.counters[rank, FRAMES] += frames
        self.counters[rank, UPDATES] += updates

    def add_episode(self, rank: int, score: float, length: int) -> None:
        n = int(self.counters[rank, EPISODES])
        ring = self.episodes[rank]
        ring[n % len(ring)] = torch.tensor([score, length, float(self.frames)], dtype=torch.float64)
        self.counters[rank, EPISODES] += 1  # after the row: a reader never sees a row before it is complete

    def add_eval(self, frames: int, mean: float, std: float, episodes: int) -> None:
        n = int(self.evals_written)
        self.evals[n % len(self.evals)] = torch.tensor([frames, mean, std, episodes], dtype=torch.float64)
        self.evals_written += 1

    def set_final_eval(self, frames: int, mean: float, std: float, episodes: int) -> None:
        self.final_eval.copy_(torch.tensor([1.0, frames, mean, std, episodes], dtype=torch.float64))

    def restore(self, frames: int, updates: int, episodes: int) -> None:
        """Continue a resumed run's counters (call before any worker starts)."""
        self.resumed.copy_(torch.tensor([frames, updates, episodes]))

    # --- readers ----------------------------------------------------------------------------------------------------
    @property
    def frames(self) -> int:
        return int(self.counters[:, FRAMES].sum() + self.resumed[FRAMES])

    def snapshot(self) -> dict[str, int]:
        frames, updates, episodes = (self.counters.sum(0) + self.resumed).tolist()
        return {"frames": frames, "updates": updates, "episodes": episodes, "evals": int(self.evals_written)}

    def episodes_since(self, seen: list[int]) -> list[tuple[int, float, float, float]]:
        """Episodes finished since ``seen`` (per-worker counts, updated in place) as ``(rank, score, length, frames)``."""
        rows = []
        for rank, ring in enumerate(self.episodes):
            total = int(self.counters[rank, EPISODES])
            for i in range(max(seen[rank], total - len(ring)), total):  # older than one lap of the ring: gone
                score, length, frames = ring[i % len(ring)].tolist()
                rows.append((rank, score, length, frames))
            seen[rank] = total
        return sorted(rows, key=lambda row: row[3])

    def evals_since(self, seen: int) -> tuple[list[tuple[float, float, float, float]], int]:
        """Evaluations recorded after the first ``seen`` ones as ``(frames, mean, std, episodes)``, and the count."""
        total = int(self.evals_written)
        first = max(seen, total - len(self.evals))
        return [tuple(self.evals[i % len(self.evals)].tolist()) for i in range(first, total)], total

    def recent_scores(self, n: int = 20) -> list[float]:
        """The scores of the last ``n`` episodes (by frame count) over all workers."""
        seen = [max(0, int(c) - n) for c in self.counters[:, EPISODES]]
        return [row[1] for row in self.episodes_since(seen)[-n:]]

    def final_evaluation(self) -> dict[str, float] | None:
        done, frames, mean, std, episodes = self.final_eval.tolist()
        return {"frames": frames, "return": mean, "return_std": std, "episodes": episodes} if done else None
