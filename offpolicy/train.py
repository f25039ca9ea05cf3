"""Entry point of the off-policy engine: ``python -m offpolicy.train algo=NAME [env=...] [key=value...]`` (the
algorithms: offpolicy/algos/).

Builds the parts (algos/: which; engines/: where they run), runs the loop (loop.py) with the services around
it (invariants, metrics, evaluation, checkpoints, Ctrl-C), and writes the summary. The same code serves every engine.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from offpolicy.algos import ALGOS, build_parts
from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, check_spaces, compose_config
from offpolicy.engines import describe_failure, make_engine, training_env_copies
from offpolicy.engines.base import LearnerLost
from offpolicy.envs import eval_max_steps, make_eval_env, make_train_env, obs_norm_state
from offpolicy.evaluate import AsyncEvaluator
from offpolicy.invariants import InvariantError, RoundInvariants
from offpolicy.loop import train_loop
from offpolicy.metrics import RoundMetrics, SharedLogger
from offpolicy.report import Progress
from shared import compat
from shared.checkpoint import resumed_seed, save_checkpoint
from shared.config import help_text, make_run_dir, run_cli
from shared.logging import make_logger
from shared.plots import plot_curves

compat.fast_from_any()

USAGE = (f"usage: python -m offpolicy.train algo={'|'.join(ALGOS)} [env=NAME] [profile=smoke|local|ray_smoke|...] "
         "[engine=local|ray] [run_dir=PATH] [resume=CHECKPOINT] [key=value ...]")
EXIT_INVARIANT = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130


class Run:
    """The services around the loop: counters, invariants, metrics, evaluation, checkpoints and the stop flag."""

    def __init__(self, cfg: DictConfig, run_dir: Path, engine, parts, action_spec, progress: Progress,
                 logger: SharedLogger, evaluator: AsyncEvaluator, obs_norm: dict | None):
        self.cfg, self.engine, self.parts, self.progress = cfg, engine, parts, progress
        self.evaluator, self.obs_norm = evaluator, obs_norm
        self.invariants = RoundInvariants(engine.replay_writes())
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
        """Atomically write everything a resume needs to ``checkpoints/last.pt``."""
        cfg, parts = self.cfg, self.parts
        keep_replay = cfg.replay.in_checkpoint or cfg.replay.storage == "memmap"
        state = {
            "config": OmegaConf.to_container(cfg, resolve=True),
            "counters": self.progress.state_dict(),
            "learner": self.engine.learner_state(),
            "exploration": parts.exploration.state_dict() if parts.exploration is not None else None,
            "obs_norm": self.obs_norm,
            "replay": self.engine.replay_state() if keep_replay else None,
            "rng": torch.get_rng_state(),
        }
        self.checkpoint_saved = save_checkpoint(self.checkpoint_path, state)
        self._last_checkpoint = time.monotonic()
        return self.checkpoint_saved


def replay_storage(checkpoint: dict) -> str:
    """The replay storage a checkpoint was written with (``memory`` or ``memmap``)."""
    return checkpoint["config"]["replay"]["storage"]


def _env_tag(name: str) -> str:
    return name.replace("/", "_")


def train(cfg: DictConfig, checkpoint: dict | None = None) -> dict:
    """Run one training job described by ``cfg``; returns the summary (also written to ``summary.json``)."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    progress = Progress.from_state(checkpoint["counters"] if checkpoint is not None else None)
    seed = resumed_seed(cfg.seed, progress.env_steps)  # a resumed run plays new episodes, not the first run's again
    env = make_train_env(cfg, checkpoint["obs_norm"] if checkpoint is not None else None, seed=seed,
                         num_envs=training_env_copies(cfg))
    check_spaces(cfg, env)
    run_dir = make_run_dir(cfg, f"offpolicy-{cfg.algo}-{_env_tag(cfg.env.name)}")
    parts = build_parts(cfg, env)
    norm = obs_norm_state(env)
    engine = make_engine(cfg, env, parts, run_dir, seed)  # the one place where local or Ray is chosen
    try:
        if checkpoint is not None:
            if parts.exploration is not None:
                parts.exploration.load_state_dict(checkpoint["exploration"])
            if checkpoint["replay"] is not None and replay_storage(checkpoint) == cfg.replay.storage:
                engine.restore_replay(checkpoint["replay"])  # (another storage: the run resumes with an empty replay)
            engine.restore(checkpoint["learner"], version=progress.batches)
            torch.set_rng_state(checkpoint["rng"])
        per_batch = cfg.collector.env_steps_per_batch
        print(f"offpolicy {cfg.algo} on {cfg.env.name}: {engine.describe()}UTD {cfg.optim.utd_ratio:g} optimiser "
              f"steps per collected transition = {round(cfg.optim.utd_ratio * per_batch)} steps "
              f"per {per_batch}-transition batch, batch size {cfg.optim.batch_size} "
              f"({cfg.optim.batch_size * cfg.optim.utd_ratio:g} replayed samples per transition); prefill "
              f"{cfg.collector.prefill_env_steps} env steps; run dir {run_dir}"
              + (f"; resumed at {progress.env_steps} env steps" if checkpoint is not None else ""), flush=True)
        config = OmegaConf.to_container(cfg, resolve=True)
        logger = SharedLogger(make_logger(cfg.logger.backend, run_dir, config=config))
        evaluator = AsyncEvaluator(lambda render: make_eval_env(cfg, render=render, obs_norm=norm), parts.eval_policy,
                                   logger, episodes=cfg.eval.episodes, max_steps=eval_max_steps(cfg),
                                   video_dir=run_dir / "videos" if cfg.eval.video else None)
        run = Run(cfg, run_dir, engine, parts, env.action_spec_unbatched, progress, logger, evaluator, norm)
        status, error = _train_until_stopped(cfg, engine, parts, run)
    finally:
        engine.close()
    status, error = _final_evaluation(cfg, run, status, error)
    logger.close()
    evals = [stats["return"] for _, stats in evaluator.results]
    summary = {
        "algo": cfg.algo, "env": cfg.env.name, "engine": cfg.engine, "status": status, "error": error,
        "env_steps": progress.env_steps, "optim_steps": progress.optim_steps, "batches": progress.batches,
        "policy_version": progress.batches, "replay_writes": run.invariants.replay_writes,
        "episodes": progress.episodes, "utd_ratio": cfg.optim.utd_ratio,
        "train_return_last": run.metrics.last_return,
        "eval_return_last": evals[-1] if evals else None, "eval_return_best": max(evals) if evals else None,
        "collector_restarts": engine.collector_restarts(),
        "eval_error": evaluator.error, "compile_recompiles": run.metrics.compile_recompiles,
        "elapsed_s": round(progress.elapsed_s, 2), "checkpoint": run.checkpoint_saved and str(run.checkpoint_saved),
        "run_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_curves(run_dir, {"train": "train/return", "eval": "eval/return"},
                title=f"{cfg.algo.upper()} on {cfg.env.name}", xlabel="collected env steps")
    return summary


def _train_until_stopped(cfg: DictConfig, engine, parts, run: Run) -> tuple[str, str | None]:
    """Run the loop with Ctrl-C / SIGTERM turned into a stop after the current round, a second one into a stop after
    the current optimiser step (collection finishes its batch), and save a checkpoint at the end: every stop ends at
    a round boundary with the counters matching the learner, so the checkpoint resumes. A third one aborts at once
    and keeps the latest checkpoint on disk (written at a round boundary). Returns ``(status, error)``."""
    status, error = "completed", None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum, frame):
        nonlocal status
        status = "interrupted"
        name = signal.Signals(signum).name
        if not run.stop_requested:
            run.stop_requested = True
            print(f"\n{name}: stopping after this round (again: after the current optimiser step)", file=sys.stderr)
            return
        run.stop_now = True
        print(f"\n{name}: stopping after the current optimiser step (again: abort without saving)", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in previous:
        signal.signal(sig, stop)
    try:
        train_loop(cfg, engine, parts, run)
    except InvariantError as exc:  # also when raised in a Ray learner rank (Ray's error derives from the cause)
        status, error = "invariant_broken", str(exc).strip().splitlines()[-1]
    except KeyboardInterrupt:  # aborted mid-round: the state in memory is not at a round boundary, keep the last one
        run.checkpoint_saved = run.checkpoint_path if run.checkpoint_path.exists() else None
        print(f"aborted: not saved; the latest checkpoint is {run.checkpoint_saved}", file=sys.stderr)
        return "interrupted", None
    except Exception as exc:
        error = describe_failure(exc)
        if error is None:
            raise
        status = "failed"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if run.bar is not None:
            run.bar.close()
    try:
        run.save_checkpoint()
    except LearnerLost as exc:
        run.checkpoint_saved = run.checkpoint_path if run.checkpoint_path.exists() else None
        print(f"warning: {exc}: the latest checkpoint is {run.checkpoint_saved}", file=sys.stderr)
    return status, error


def _final_evaluation(cfg: DictConfig, run: Run, status: str, error: str | None) -> tuple[str, str | None]:
    """The final evaluation of a completed run; Ctrl-C / SIGTERM during it stops it, and the summary is still
    written."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if status == "completed" and cfg.eval.final_episodes:
            print(f"final evaluation: {cfg.eval.final_episodes} episodes", flush=True)
            run.evaluator.submit(run.progress.env_steps, run.parts.eval_policy, episodes=cfg.eval.final_episodes)
        run.evaluator.wait()
    except KeyboardInterrupt:
        status = "interrupted"
        print("\ninterrupted during the final evaluation (training was complete)", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        run.evaluator.close()
    return status, error


def main(argv: list[str]) -> int:
    """CLI: compose the config, train, print where the results are; exit 3 on a broken invariant, 4 when a Ray actor
    fails, 130 on Ctrl-C."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(CONFIG_DIR, USAGE, ALIASES, GROUPS))
        return 0
    cfg, checkpoint = compose_config(argv)
    summary = train(cfg, checkpoint)
    print(json.dumps(summary))
    if summary["status"] == "invariant_broken":
        print(f"error: invariant broken: {summary['error']}; checkpoint saved to {summary['checkpoint']}",
              file=sys.stderr)
        return EXIT_INVARIANT
    if summary["status"] == "failed":
        print(f"error: {summary['error']}; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_FAILED
    if summary["status"] == "interrupted":
        print(f"interrupted; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    run_cli(main)
