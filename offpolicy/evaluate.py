"""Evaluation of the deterministic policy: the episodes (:func:`play_episodes`), the background evaluator of a
training run (a thread playing snapshots of the weights, so training never waits for it; results go to ``eval/``
and optionally an mp4 per evaluation), and the CLI.

``python -m offpolicy.evaluate checkpoint=<path> episodes=10 video=true`` prints the mean and std return and writes
``evaluation.json``.
"""
from __future__ import annotations

import copy
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from offpolicy.engines import engine_class
from offpolicy.invariants import check_finite
from shared.config import run_cli
from shared.evaluation import evaluate_cli_args, evaluation_dir, return_stats, write_evaluation, write_video
from shared.rendering import render_frame
from shared.schema import key


def play_episodes(env, policy, episodes: int, max_steps: int, render: bool = False,
                  stop: Callable[[], bool] = lambda: False):
    """Play ``episodes`` episodes of the deterministic ``policy`` (fewer if ``stop()`` turns true); return
    ``(returns, lengths, frames_of_first_episode)``. The exploration type is not set: tensordict keeps it process-wide,
    and this runs in the evaluator's thread beside training (the eval policies do not read it)."""
    returns, lengths, frames = [], [], []

    def grab(env_, td):
        frames.append(render_frame(env_))

    with torch.no_grad():
        for i in range(episodes):
            if stop():
                break
            rollout = env.rollout(max_steps, policy, break_when_any_done=True,
                                  callback=grab if (render and i == 0) else None)
            returns.append(float(rollout["next", "reward"].sum()))
            lengths.append(rollout["next", "reward"].numel())
    return returns, lengths, frames


class AsyncEvaluator:
    """Evaluates submitted weight snapshots in a daemon thread; a newer request replaces one still waiting."""

    def __init__(self, make_env: Callable, policy, logger, *, episodes: int, max_steps: int,
                 video_dir: Path | None = None):
        self._make_env = make_env
        self._policy = copy.deepcopy(policy)
        self._logger = logger
        self._episodes = episodes
        self._max_steps = max_steps
        self._video_dir = video_dir
        self._env = None
        self._cond = threading.Condition()
        self._pending: tuple[int, TensorDict, int] | None = None
        self._busy = False
        self._closed = False
        self.error: str | None = None  # the first failure, as one line (training goes on without evaluations)
        self.results: list[tuple[int, dict]] = []
        self._thread = threading.Thread(target=self._run, name="offpolicy-eval", daemon=True)
        self._thread.start()

    def submit(self, env_steps: int, policy, episodes: int | None = None) -> None:
        """Queue an evaluation of ``policy``'s current weights, logged at step ``env_steps``."""
        weights = TensorDict.from_module(policy).data.clone()
        with self._cond:
            self._pending = (env_steps, weights, episodes or self._episodes)
            self._cond.notify()

    def wait(self) -> None:
        """Block until every submitted evaluation has finished (or failed: see :attr:`error`)."""
        with self._cond:
            self._cond.wait_for(lambda: (self._pending is None and not self._busy) or self._closed)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)
        if self._env is not None:
            self._env.close()

    def _run(self) -> None:
        torch.set_num_threads(1)
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed:
                    return
                env_steps, weights, episodes = self._pending
                self._pending = None
                self._busy = True
            try:
                self._evaluate(env_steps, weights, episodes)
            except Exception as exc:  # reported at once; training goes on, the summary carries it
                if self.error is None:
                    self.error = f"evaluation at {env_steps} env steps failed: {type(exc).__name__}: " + \
                        " ".join(str(exc).split())[:300]
                    print(f"\nwarning: {self.error}", file=sys.stderr, flush=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _evaluate(self, env_steps: int, weights: TensorDict, episodes: int) -> None:
        render = self._video_dir is not None
        if self._env is None:
            if render:
                os.environ.setdefault("MUJOCO_GL", "egl")
            self._env = self._make_env(render=render)
        weights.to_module(self._policy)
        returns, lengths, video = play_episodes(self._env, self._policy, episodes, self._max_steps, render,
                                                stop=lambda: self._closed)
        if self._closed:  # cut short by close(): nothing to report
            return
        stats = return_stats(returns)
        stats["length"] = float(np.mean(lengths))
        metrics = {f"eval/{k}": v for k, v in stats.items()}
        check_finite(metrics)  # a non-finite return fails this evaluation (reported; training goes on)
        self.results.append((env_steps, stats))
        self._logger.log(metrics, env_steps)
        if video:
            write_video(self._video_dir / f"eval-{env_steps}.mp4", video, fps=30)


@dataclass
class EvaluateConfig:
    """The keys of ``python -m offpolicy.evaluate``."""

    checkpoint: str | None = key(None, "path to a checkpoint written by offpolicy.train (required)")
    episodes: int = key(10, "deterministic episodes, played one after another", min=1, integer=True)
    seed: int | None = key(None, "seed of the evaluation env (null: the run's own evaluation seed)", min=0,
                           integer=True, nullable=True)
    video: bool = key(False, "write an mp4 of the first episode (needs the video extra; MuJoCo renders with "
                             "MUJOCO_GL=egl)")
    run_dir: str | None = key(None, "where evaluation.json and the video go (default: the checkpoint's run dir)")


EVALUATE_HEADER = """python -m offpolicy.evaluate checkpoint=<path> [episodes=10] [video=true]: deterministic episodes of a saved
off-policy policy, on the evaluation env of the run that wrote the checkpoint (Atari: whole games, raw scores).
Generated from offpolicy/evaluate.py by `python -m offpolicy.config`: edit the declarations there, not this file."""
USAGE = "usage: python -m offpolicy.evaluate checkpoint=<path> [episodes=10] [seed=N] [video=true] [run_dir=PATH]"


def main(argv: list[str]) -> int:
    """Evaluate a checkpoint of ``offpolicy.train``: prints ``return: mean +- std`` and writes evaluation.json (and
    an mp4 of the first episode with ``video=true``) into the run directory."""
    from offpolicy import prepare_process
    from offpolicy.builder import Builder
    from offpolicy.checkpoint import Checkpoint
    from offpolicy.envs import eval_max_steps
    from offpolicy.progress import Progress
    from shared.envs import check_renders

    args = evaluate_cli_args(EvaluateConfig, EVALUATE_HEADER, USAGE, argv, written_by="offpolicy.train")
    if args is None:
        return 0
    prepare_process()
    checkpoint = Checkpoint.read(args.checkpoint, key="checkpoint")
    out_dir = evaluation_dir(args)
    cfg = OmegaConf.create(checkpoint.config)
    if args.seed is not None:
        cfg.seed = args.seed  # the evaluation env's seed derives from it (offpolicy/envs.py eval_seed)
    if args.video:
        os.environ.setdefault("MUJOCO_GL", "egl")
        if cfg.env.kind == "gymnasium":
            check_renders(cfg.env.name)  # one error line, before any episode
    torch.set_num_threads(engine_class(cfg.engine).learner_threads(cfg))
    env = Builder(cfg).eval_env(render=args.video, obs_norm=checkpoint.obs_norm)  # cfg: with the seed given here
    try:
        returns, lengths, frames = play_episodes(env, checkpoint.eval_policy(env), args.episodes, eval_max_steps(cfg),
                                                 render=args.video)
    finally:
        env.close()
    env_steps = Progress.from_state(checkpoint.counters).env_steps
    video = out_dir / "videos" / f"evaluate_{env_steps}.mp4" if frames else None
    if video is not None:
        write_video(video, frames, fps=30)
    result = {**return_stats(returns), "returns": returns, "lengths": lengths, "env_steps_trained": env_steps,
              "algo": cfg.algo, "env": cfg.env.name, "checkpoint": str(args.checkpoint),
              "video": str(video) if video else None}
    write_evaluation(out_dir, result, f"deterministic episodes ({cfg.algo} on {cfg.env.name}, {env_steps} env steps "
                     "trained)")
    return 0


if __name__ == "__main__":
    run_cli(main)
