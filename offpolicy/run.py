"""One training run: it builds its engine (which owns the training env, the collector, replay and learner), logger
and evaluator, prints the start line, runs the loop (offpolicy/loop.py) with the services the loop calls
(invariants, metrics, evaluation, checkpoints) and the stop flags that Ctrl-C / SIGTERM set, then the final evaluation,
and writes the summary. The same for every engine."""
from __future__ import annotations

import json
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from offpolicy.builder import Builder
from offpolicy.checkpoint import Checkpoint
from offpolicy.compiling import CompileChoice
from offpolicy.engines import engine_class
from offpolicy.engines.base import LearnerLost
from offpolicy.envs import eval_max_steps, obs_norm_state
from offpolicy.evaluate import AsyncEvaluator
from offpolicy.invariants import InvariantError, RoundInvariants
from offpolicy.metrics import RoundMetrics, SharedLogger
from offpolicy.progress import Progress
from shared import denormals
from shared.checkpoint import resumed_seed
from shared.config import make_run_dir
from shared.env_guard import EnvFault, env_fault_of
from shared.files import atomic_write_text
from shared.logging import make_logger
from shared.plots import plot_curves
from shared.processes import check_main_guard


def optim_steps_per_batch(cfg: DictConfig) -> int:
    """Optimiser steps after each collected batch once replay holds the prefill: ``utd_ratio *
    env_steps_per_batch`` (the config check makes it a positive integer)."""
    return round(cfg.optim.utd_ratio * cfg.collector.env_steps_per_batch)


class Run:
    """One training run of ``cfg`` (resumed from ``checkpoint``): its engine, logger, evaluator, counters,
    invariants, metrics, checkpoints and stop flags. :meth:`train` runs it to the end."""

    def __init__(self, cfg: DictConfig, checkpoint: Checkpoint | None = None):
        self.cfg = cfg
        self.progress = progress = Progress.from_state(checkpoint.counters if checkpoint is not None else None)
        seed = resumed_seed(cfg.seed, progress.env_steps)  # a resumed run plays new episodes, not the first run's again
        builder = Builder(cfg)
        engine_cls = engine_class(cfg.engine)  # the one place where local or Ray is chosen
        needs = engine_cls.run_needs(cfg)
        denormals.start_intra_op_threads(needs.threads)  # before the run's first parallel op: they inherit FTZ
        if needs.spawns is not None:  # before the first child: a script without a __main__ guard would start it again
            check_main_guard(f"offpolicy.train with {needs.spawns}")
        self.steps_per_batch = optim_steps_per_batch(cfg)
        # each resource in the order it starts; a step that fails closes those started before it, in reverse order
        with ExitStack() as started:
            env = builder.train_env(checkpoint.obs_norm if checkpoint is not None else None, seed=seed,
                                    num_envs=needs.env_copies)
            started.callback(env.close)
            # the parts check that the env's actions suit the algorithm, before the run writes any file
            self.parts = parts = builder.parts(env, needs.device)
            self.run_dir = make_run_dir(cfg, f"offpolicy-{cfg.algo}-{cfg.env.name}")
            self.obs_norm = obs_norm_state(env)
            started.pop_all()  # the engine owns env from here: it closes it, also when it fails to start
            self.engine = engine_cls(builder, env, parts, self.run_dir, seed)
            started.callback(self.engine.close)
            if checkpoint is not None:
                checkpoint.restore(self.engine, parts.exploration, storage=cfg.replay.storage,
                                   version=progress.batches)
            print(self.start_line(builder.compile, needs.threads, resumed=checkpoint is not None), flush=True)
            self.logger = SharedLogger(make_logger(cfg.logger.backend, self.run_dir,
                                                   config=OmegaConf.to_container(cfg, resolve=True)))
            started.callback(self.logger.close)
            self.evaluator = AsyncEvaluator(
                lambda render: builder.eval_env(render=render, obs_norm=self.obs_norm), parts.eval_policy,
                self.logger, episodes=cfg.eval.episodes, max_steps=eval_max_steps(cfg),
                video_dir=self.run_dir / "videos" if cfg.eval.video else None)
            started.pop_all()  # all started: train() closes them
        self.invariants = RoundInvariants(self.engine.replay_writes(), self.engine.policy_lag)
        self.bar = tqdm(total=cfg.total_env_steps, initial=progress.env_steps, unit="step", unit_scale=True,
                        dynamic_ncols=True) if cfg.logger.progress_bar else None
        evaluator = self.evaluator
        self.metrics = RoundMetrics(self.logger, interval_s=cfg.logger.interval_s,
                                    action_bounds=parts.action_bounds(env.action_spec_unbatched),
                                    exploration_value=parts.exploration_value, bar=self.bar,
                                    last_eval=lambda: "failed" if evaluator.error else
                                    evaluator.results[-1][1]["return"] if evaluator.results else None)
        self.checkpoint_path = self.run_dir / "checkpoints" / "last.pt"
        self.checkpoint_saved: Path | None = None  # the latest checkpoint written (or found) for this run
        self.stop_requested = False  # first Ctrl-C / SIGTERM: stop after this round
        self.stop_now = False  # second: stop after the current optimiser step (the round is recorded as it ran)
        self.env_fault: EnvFault | None = None  # the user's env failure that ended the run
        self.broken_state: Path | None = None  # the state at a broken invariant (checkpoints/broken.pt)
        interval = cfg.eval.interval_env_steps
        self._next_eval = (progress.env_steps // interval + 1) * interval if interval else None
        self._last_checkpoint = time.monotonic()

    def start_line(self, compiled: CompileChoice, threads: int, resumed: bool) -> str:
        """What the run prints when it starts: algorithm, env, where the parts run, UTD and replay ratio, prefill,
        whether the learner step is compiled and why, on how many (``threads``) threads, what the parts add (DQN's CNN
        precision), run directory, and where a ``resumed`` run goes on from."""
        cfg = self.cfg
        flushed = ("subnormals flushed" if denormals.every_thread_flushes() else
                   "subnormals flushed on the main thread only (torch's threads started before this run)")
        return (f"offpolicy {cfg.algo} on {cfg.env.name}: {self.engine.describe()}UTD {cfg.optim.utd_ratio:g} "
                f"optimiser steps per collected transition = {self.steps_per_batch} steps per "
                f"{cfg.collector.env_steps_per_batch}-transition batch, batch size {cfg.optim.batch_size} "
                f"({cfg.optim.batch_size * cfg.optim.utd_ratio:g} replayed samples per transition); prefill "
                f"{cfg.collector.prefill_env_steps} env steps; learner step {compiled.describe()} on "
                f"{threads} torch thread{'s' if threads > 1 else ''} (threads={cfg.threads}), {flushed}; "
                + (f"{self.parts.describe}; " if self.parts.describe else "")
                + f"run dir {self.run_dir}"
                + (f"; resumed at {self.progress.env_steps} env steps" if resumed else ""))

    def train(self, loop: Callable[["Run"], None]) -> dict:
        """Run ``loop(self)`` until it ends or is stopped (:meth:`until_stopped`), close the engine, run the final
        evaluation, close the logger, write ``summary.json`` and the curves; returns the summary. An exception that
        is neither the env's nor an engine's known failure (a defect) still gets its summary (``status: crashed``,
        the latest whole-round checkpoint) before it propagates with its traceback."""
        crash = None
        try:
            status, error = self.until_stopped(loop)
        except Exception as exc:
            crash, status = exc, "crashed"
            error = f"{type(exc).__name__}: {next(iter(str(exc).strip().splitlines()), '')}".rstrip(": ")
            # the state in memory may be mid-round: no checkpoint of it, the last whole round's stays
            self.checkpoint_saved = self.checkpoint_path if self.checkpoint_path.exists() else None
        finally:
            self.engine.close()
        status, error = self.final_evaluation(status, error)
        self.logger.close()
        summary = self.summary(status, error)
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        cfg = self.cfg
        plot_curves(self.run_dir, {"train": "train/return", "eval": "eval/return"},
                    title=f"{cfg.algo.upper()} on {cfg.env.name}", xlabel="collected env steps")
        if crash is not None:
            print(f"error: crashed: {error}; summary: {self.run_dir / 'summary.json'}; latest checkpoint: "
                  f"{self.checkpoint_saved}", file=sys.stderr)
            raise crash
        return summary

    def evaluate_if_due(self) -> None:
        """Submit the deterministic policy to the background evaluator every ``eval.interval_env_steps``; stop after
        this round once a finished evaluation's mean return reached ``eval.stop_return``."""
        if self._next_eval is not None and self.progress.env_steps >= self._next_eval:
            self.evaluator.submit(self.progress.env_steps, self.parts.eval_policy)
            interval = self.cfg.eval.interval_env_steps
            self._next_eval = (self.progress.env_steps // interval + 1) * interval
        if self.record_stop_return(then=": stopping after this round"):
            self.stop_requested = True

    def record_stop_return(self, then: str) -> bool:
        """Record the first finished evaluation whose mean return reached ``eval.stop_return`` (once per run, resumes
        included: it is one of the counters); True when this call recorded it. Every finished result is looked at,
        not only the latest, and the loop's end looks again, so an evaluation that finishes after the last round (the
        one submitted in it, or the final one) still counts. Prints a line ending in ``then`` when it records."""
        target = self.cfg.eval.stop_return
        if target is None or self.progress.stop_return_reached is not None:
            return False
        for env_steps, stats in self.evaluator.results:
            if stats["return"] >= target:
                self.progress.stop_return_reached = {
                    "eval_env_steps": env_steps, "return": stats["return"],
                    "stopped_at_env_steps": self.progress.env_steps,
                    "stopped_at_elapsed_s": round(self.progress.elapsed_s, 2)}
                print(f"\nevaluation at {env_steps} env steps returned {stats['return']:g} >= eval.stop_return="
                      f"{target:g}{then}", flush=True)
                return True
        return False

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

    def save_broken_state(self, error: str) -> None:
        """The state at a broken invariant goes to ``checkpoints/broken.pt``, for inspection (marked: a resume refuses
        it); ``last.pt`` keeps the last whole round's checkpoint, if one was written, so every ``last.pt`` resumes."""
        self.checkpoint_saved = self.checkpoint_path if self.checkpoint_path.exists() else None
        try:
            self.broken_state = Checkpoint.write(self.checkpoint_path.with_name("broken.pt"), self.cfg,
                                                 counters=self.progress.state_dict(), engine=self.engine,
                                                 exploration=self.parts.exploration, obs_norm=self.obs_norm,
                                                 broken=error)
        except InvariantError as exc:  # Ray ranks that diverged have no one learner state to keep
            print(f"warning: the state at the break is not kept ({exc})", file=sys.stderr)

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
            fault = env_fault_of(exc)  # the user's env failed (raised, or a non-finite value), in whichever process
            if fault is not None:
                self.env_fault = fault
                error = f"{fault} (after {self.progress.env_steps} env steps of the run)"
            else:
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
            if status == "invariant_broken":
                self.save_broken_state(error)
            else:
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
            self.record_stop_return(then="")
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
            "stop_return_reached": progress.stop_return_reached,
            "collector_restarts": self.engine.collector_restarts(),
            "env_fault": None if self.env_fault is None else {
                "env": self.env_fault.env, "step": self.env_fault.step, "cause": self.env_fault.cause},
            "eval_error": self.evaluator.error, "compile_recompiles": self.metrics.compile_recompiles,
            "elapsed_s": round(progress.elapsed_s, 2),
            "checkpoint": self.checkpoint_saved and str(self.checkpoint_saved),
            "broken_state": self.broken_state and str(self.broken_state), "run_dir": str(self.run_dir),
        }
