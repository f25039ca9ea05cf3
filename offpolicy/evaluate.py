"""Asynchronous evaluation: a background thread plays episodes with the deterministic policy on snapshots of its
weights, so training never waits for it; results go to ``eval/`` (and optionally an mp4 per evaluation)."""
from __future__ import annotations

import copy
import os
import sys
import threading
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tensordict import TensorDict

from shared.rendering import render_frame
from shared.evaluation import return_stats, write_video


def play_episodes(env, policy, episodes: int, max_steps: int, render: bool = False,
                  stop: Callable[[], bool] = lambda: False):
    """Play ``episodes`` deterministic episodes (fewer if ``stop()`` turns true); return ``(returns, lengths,
    frames_of_first_episode)``."""
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    returns, lengths, frames = [], [], []

    def grab(env_, td):
        frames.append(render_frame(env_))

    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
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
        self.results.append((env_steps, stats))
        self._logger.log({f"eval/{k}": v for k, v in stats.items()}, env_steps)
        if video:
            write_video(self._video_dir / f"eval-{env_steps}.mp4", video, fps=30)
