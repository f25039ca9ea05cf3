"""One training run around the loop (offpolicy/loop.py): its counters (:class:`Progress`), and the services the loop
calls (:class:`Run`: invariants, metrics, evaluation, checkpoints), the stop flags that Ctrl-C / SIGTERM set, the final
evaluation and the summary. The same for every engine."""
from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig
from tqdm import tqdm

from offpolicy.algos import AlgoParts
from offpolicy.checkpoint import Checkpoint
from offpolicy.compiling import compile_choice
from offpolicy.engines.base import Engine, LearnerLost
from offpolicy.evaluate import AsyncEvaluator
from offpolicy.invariants import InvariantError, RoundInvariants
from offpolicy.metrics import RoundMetrics, SharedLogger


def optim_steps_per_batch(cfg: DictConfig) -> int:
    """Optimiser steps after each collected batch once replay holds the prefill: ``utd_ratio *
    env_steps_per_batch`` (the config check makes it a positive integer)."""
    return round(cfg.optim.utd_ratio * cfg.collector.env_steps_per_batch)


def start_line(cfg: DictConfig, engine: Engine, run_dir: Path, progress: "Progress", resumed: bool) -> str:
    """What a run prints when it starts: algorithm, env, where the parts run, UTD and replay ratio, prefill, whether
    the learner step is compiled and why, run directory."""
    return (f"offpolicy {cfg.algo} on {cfg.env.name}: {engine.describe()}UTD {cfg.optim.utd_ratio:g} optimiser steps "
            f"per collected transition = {optim_steps_per_batch(cfg)} steps per "
            f"{cfg.collector.env_steps_per_batch}-transition batch, batch size {cfg.optim.batch_size} "
            f"({cfg.optim.batch_size * cfg.optim.utd_ratio:g} replayed samples per transition); prefill "
            f"{cfg.collector.prefill_env_steps} env steps; learner step {compile_choice(cfg).describe()}; "
            f"run dir {run_dir}"
            + (f"; resumed at {progress.env_steps} env steps" if resumed else ""))


@dataclass
class Progress:
    """The run's counters (checkpointed; a resumed run continues them)."""

    env_steps: int = 0  # collected transitions (env steps summed over envs)
    optim_steps: int = 0
    batches: int = 0  # rounds = weight publications
    episodes: int = 0
    start_elapsed_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    @property
    def elapsed_s(self) -> float:
        return self.start_elapsed_s + time.perf_counter() - self.started

    def advance(self, report) -> None:
        """Count one round (a :class:`~offpolicy.report.RoundReport`)."""
        self.env_steps += report.rollout.env_steps
        self.optim_steps += report.steps_done
        self.batches += 1
        self.episodes += len(report.rollout.returns)

    def state_dict(self) -> dict:
        return {"env_steps": self.env_steps, "optim_steps": self.optim_steps, "batches": self.batches,
                "episodes": self.episodes, "elapsed_s": self.elapsed_s}

    @classmethod
    def from_state(cls, state: dict | None) -> "Progress":
        if not state:
            return cls()
        env_steps = state["env_steps"] if "env_steps" in state else state["collected_frames"]  # the pre-0.2 name
        return cls(env_steps=env_steps, optim_steps=state["optim_steps"], batches=state["batches"],
                   episodes=state["episodes"], start_elapsed_s=state["elapsed_s"])


class Run:
    """The services around the loop: counters, invariants, metrics, evaluation, checkpoints and the stop flags."""

    def __init__(self, cfg: DictConfig, run_dir: Path, engine: Engine, parts: AlgoParts, action_spec,
                 progress: Progress, logger: SharedLogger, evaluator: AsyncEvaluator, obs_norm: dict | None):
        self.cfg, self.run_dir, self.engine, self.parts, self.progress = cfg, run_dir, engine, parts, progress
        self.logger, self.evaluator, self.obs_norm = logger, evaluator, obs_norm
        self.steps_per_batch = optim_steps_per_batch(cfg)
        self.invariants = RoundInvariants(engine.replay_writes(), engine.policy_lag)
        self.bar = tqdm(total=cfg.total_env_steps, initial=progress.env_steps, unit="step", unit_scale=True,
                        dynamic_ncols=True) if cfg.logger.progress_bar else None
        self.metrics = RoundMetrics(logger, interval_s=cfg.logger.interval_s,
                                    action_bounds=parts.action_bounds(action_spec),
                                    exploration_value=parts.exploration_value, bar=self.bar,
                                    last_eval=lambda: "failed" if evaluator.error else
                                    evaluator.results[-1][1]["return"] if evaluator.results else None)
        self.checkpoint_path = run_dir / "checkpoints" / "last.pt"
        self.checkpoint_saved: Path | None = None  # the latest checkpoint written (or found) for this run
        self.stop_requested = False  # first Ctrl-C / SIGTERM: stop after this round
        self.stop_now = False  # second: stop after the current optimiser step (the round is recorded as it ran)
        interval = cfg.eval.interval_env_steps
        self._next_eval = (progress.env_steps // interval + 1) * interval if interval else None
        self._last_checkpoint = time.monotonic()

    def evaluate_if_due(self) -> None:
        """Submit the deterministic policy to the background evaluator every ``eval.interval_env_steps``."""
        if self._next_eval is not None and self.progress.env_steps >= self._next_eval:
            self.evaluator.submit(self.progress.env_steps, self.parts.eval_policy)
            interval = self.cfg.eval.interval_env_steps
            self._next_eval = (self.progress.env_steps // interval + 1) * interval

    def checkpoint_if_due(self) -> None:
        interval = self.cfg.checkpoint.interval_s
        if interval and time.monotonic() - self._last_checkpoint >= interval:
            self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        """Atomically write everything a resume needs to ``checkpoints/last.pt`` (offpolicy/checkpoint.py)."""
        self.checkpoint_saved = Checkpoint.write(self.checkpoint_path, self.cfg, counters=self.progress.state_dict(),
                                                 engine=self.engine, exploration=self.parts.exploration,
                                                 obs_norm=self.obs_norm)
        self._last_checkpoint = time.monotonic()
        return self.checkpoint_saved

    def until_stopped(self, loop: Callable[["Run"], None]) -> tuple[str, str | None]:
        """Run ``loop(self)`` with Ctrl-C / SIGTERM turned into a stop after the current round, a second one into a
        stop after the current optimiser step (collection finishes its batch), and save a checkpoint at the end:
        every stop ends at a round boundary with the counters matching the learner, so the checkpoint resumes. A
        third one aborts at once and keeps the latest checkpoint on disk (written at a round boundary). Returns
        ``(status, error)``."""
        status, error = "completed", None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

        def stop(signum, frame):
            nonlocal status
            status = "interrupted"
            name = signal.Signals(signum).name
            if not self.stop_requested:
                self.stop_requested = True
                print(f"\n{name}: stopping after this round (again: after the current optimiser step)",
                      file=sys.stderr)
                return
            self.stop_now = True
            print(f"\n{name}: stopping after the current optimiser step (again: abort without saving)",
                  file=sys.stderr)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        for sig in previous:
            signal.signal(sig, stop)
        try:
            loop(self)
        except InvariantError as exc:  # also when raised in a Ray learner rank (Ray's error derives from the cause)
            status, error = "invariant_broken", str(exc).strip().splitlines()[-1]
        except KeyboardInterrupt:  # aborted mid-round: the state in memory is not at a round boundary, keep the last
            self.checkpoint_saved = self.checkpoint_path if self.checkpoint_path.exists() else None
            print(f"aborted: not saved; the latest checkpoint is {self.checkpoint_saved}", file=sys.stderr)
            return "interrupted", None
        except Exception as exc:
            error = type(self.engine).describe_failure(exc)
            if error is None:
                raise
            status = "failed"
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.bar is not None:
                self.bar.close()
        try:
            self.save_checkpoint()
        except LearnerLost as exc:
            self.checkpoint_saved = self.checkpoint_path if self.checkpoint_path.exists() else None
            print(f"warning: {exc}: the latest checkpoint is {self.checkpoint_saved}", file=sys.stderr)
        return status, error

    def final_evaluation(self, status: str, error: str | None) -> tuple[str, str | None]:
        """The final evaluation of a completed run; Ctrl-C / SIGTERM during it stops it, and the summary is still
        written."""
        def interrupt(signum, frame):
            raise KeyboardInterrupt

        previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if status == "completed" and self.cfg.eval.final_episodes:
                print(f"final evaluation: {self.cfg.eval.final_episodes} episodes", flush=True)
                self.evaluator.submit(self.progress.env_steps, self.parts.eval_policy,
                                      episodes=self.cfg.eval.final_episodes)
            self.evaluator.wait()
        except KeyboardInterrupt:
            status = "interrupted"
            print("\ninterrupted during the final evaluation (training was complete)", file=sys.stderr)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.evaluator.close()
        return status, error

    def summary(self, status: str, error: str | None) -> dict:
        """What ``summary.json`` says of the run."""
        cfg, progress = self.cfg, self.progress
        evals = [stats["return"] for _, stats in self.evaluator.results]
        return {
            "algo": cfg.algo, "env": cfg.env.name, "engine": cfg.engine, "status": status, "error": error,
            "env_steps": progress.env_steps, "optim_steps": progress.optim_steps, "batches": progress.batches,
            "policy_version": progress.batches, "replay_writes": self.invariants.replay_writes,
            "episodes": progress.episodes, "utd_ratio": cfg.optim.utd_ratio,
            "train_return_last": self.metrics.last_return,
            "eval_return_last": evals[-1] if evals else None, "eval_return_best": max(evals) if evals else None,
            "collector_restarts": self.engine.collector_restarts(),
            "eval_error": self.evaluator.error, "compile_recompiles": self.metrics.compile_recompiles,
            "elapsed_s": round(progress.elapsed_s, 2),
            "checkpoint": self.checkpoint_saved and str(self.checkpoint_saved), "run_dir": str(self.run_dir),
        }
