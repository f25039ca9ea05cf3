"""Process supervision: start the workers and the evaluator, notice and restart dead ones, stop everything."""
from __future__ import annotations

import sys
import time

from a3c.evaluate import evaluator_main
from a3c.child_process import StopFlag
from a3c.stats import SharedStats
from a3c.worker import worker_main


class WorkerFailure(RuntimeError):
    """A worker died and the restart budget is spent."""


class WorkerPool:
    """The worker processes (daemonic, forked from the fork server: they die with the main process) and the optional
    evaluator."""

    def __init__(self, ctx, cfg_dict: dict, model, optimizer, num_actions: int, stats: SharedStats):
        self.ctx, self.cfg, self.model, self.optimizer = ctx, cfg_dict, model, optimizer
        self.num_actions, self.stats = num_actions, stats
        self.stop_event = StopFlag(ctx)
        self.workers: dict[int, object] = {}
        self.incarnations = [0] * cfg_dict["workers"]
        self.deaths: list[dict] = []
        self.evaluator = None
        self.evaluator_restarts = 0

    def start(self) -> None:
        for rank in range(self.cfg["workers"]):
            self._start_worker(rank)
        if self.cfg["eval"]["interval_frames"] > 0:
            self._start_evaluator()

    def _start_evaluator(self) -> None:
        self.evaluator = self.ctx.Process(
            target=evaluator_main, name="a3c-evaluator", daemon=True,
            args=(self.cfg, self.model, self.num_actions, self.stats, self.stop_event))
        self.evaluator.start()

    def _start_worker(self, rank: int) -> None:
        process = self.ctx.Process(
            target=worker_main, name=f"a3c-worker-{rank}", daemon=True,
            args=(rank, self.incarnations[rank], self.cfg, self.model, self.optimizer, self.num_actions, self.stats,
                  self.stop_event))
        process.start()
        self.workers[rank] = process

    @property
    def restarts(self) -> int:
        return sum(self.incarnations)

    def pids(self) -> dict[str, int]:
        pids = {f"worker_{rank}": p.pid for rank, p in self.workers.items()}
        if self.evaluator is not None:
            pids["evaluator"] = self.evaluator.pid
        return pids

    def check(self) -> bool:
        """Restart dead workers (within ``supervision.max_restarts``) and a dead evaluator (within the same number of
        its own restarts); True once every worker has finished."""
        self._check_evaluator()
        finished = 0
        for rank, process in list(self.workers.items()):
            if process.exitcode is None:
                continue
            if process.exitcode == 0:
                finished += 1
                continue
            death = {"rank": rank, "pid": process.pid, "exitcode": process.exitcode, "frames": self.stats.frames}
            self.deaths.append(death)
            budget = self.cfg["supervision"]["max_restarts"]
            if self.restarts >= budget:
                raise WorkerFailure(f"worker {rank} (pid {process.pid}) died with exit code {process.exitcode} and "
                                    f"the restart budget supervision.max_restarts={budget} is spent")
            self.incarnations[rank] += 1
            print(f"warning: worker {rank} (pid {process.pid}) died with exit code {process.exitcode} at "
                  f"{death['frames']} frames; restarting it ({self.restarts}/{budget})", file=sys.stderr, flush=True)
            self._start_worker(rank)
        return finished == len(self.workers)

    def _check_evaluator(self) -> None:
        """The evaluator returns only once stopped: an exit before that is a death. Nobody may wait for its result
        then (the workers wait for a late evaluation); it is restarted, or past the budget periodic evaluation ends
        while training goes on."""
        process = self.evaluator
        if process is None or process.exitcode is None or self.stop_event.is_set():
            return
        self.stats.end_eval()
        budget = self.cfg["supervision"]["max_restarts"]
        what = f"the evaluator (pid {process.pid}) died with exit code {process.exitcode} at {self.stats.frames} frames"
        if self.evaluator_restarts >= budget:
            print(f"warning: {what}; supervision.max_restarts={budget} is spent, so periodic evaluation stops "
                  "(training goes on)", file=sys.stderr, flush=True)
            self.evaluator = None
            return
        self.evaluator_restarts += 1
        print(f"warning: {what}; restarting it ({self.evaluator_restarts}/{budget})", file=sys.stderr, flush=True)
        self._start_evaluator()

    def stop(self, timeout_s: float) -> None:
        """Ask every child to stop, wait up to ``timeout_s``, then terminate and kill what is left."""
        self.stop_event.set()
        children = list(self.workers.values()) + ([self.evaluator] if self.evaluator is not None else [])
        deadline = time.monotonic() + timeout_s
        for process in children:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in children:
            if process.is_alive():
                print(f"warning: {process.name} (pid {process.pid}) did not stop in {timeout_s}s; terminating",
                      file=sys.stderr, flush=True)
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()
