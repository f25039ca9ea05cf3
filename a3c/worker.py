"""An A3C worker process: local model <- global weights, roll out, update the global model through the shared
optimizer, repeat. Worker 0 also owns the logger (created here, in its own process, never pickled)."""
from __future__ import annotations

import time

import numpy as np
import torch
from omegaconf import OmegaConf

from a3c.child_process import process_setup
from a3c.evaluate import eval_settings, greedy_episodes
from a3c.learner import A3CLearner
from a3c.model import build_model
from a3c.rollout import Rollout
from a3c.stats import SharedStats
from shared.atari import AtariBatch, AtariSettings
from shared.logging import MetricLogger, make_logger


class Reporter:
    """Worker 0's logging: every worker's finished episodes, the evaluations, and periodic throughput and losses."""

    def __init__(self, logger: MetricLogger, stats: SharedStats, frame_skip: int, interval_s: float):
        self.logger, self.stats, self.frame_skip, self.interval_s = logger, stats, frame_skip, interval_s
        self.seen_episodes = stats.episode_counts()
        self.seen_evals = int(stats.evals_written)
        self.start = self.last_time = time.monotonic()
        self.last_frames = stats.frames

    def report(self, losses: dict[str, float], force: bool = False) -> None:
        for rank, score, length, frames in self.stats.episodes_since(self.seen_episodes):
            self.logger.log({"train/return": score, "train/episode_length": length, "a3c/episode_worker": rank},
                            step=int(frames))
        evals, self.seen_evals = self.stats.evals_since(self.seen_evals)
        for frames, mean, std, episodes, result_frames in evals:
            self.logger.log({"eval/return": mean, "eval/return_std": std, "eval/episodes": episodes,
                             "eval/lag_frames": result_frames - frames}, step=int(frames))
        now = time.monotonic()
        if force or now - self.last_time >= self.interval_s:
            counts = self.stats.snapshot()
            fps = (counts["frames"] - self.last_frames) / max(now - self.last_time, 1e-9)
            self.logger.log({**losses, "train/frames_per_s": fps, "train/agent_steps_per_s": fps / self.frame_skip,
                             "a3c/updates": counts["updates"], "a3c/episodes": counts["episodes"],
                             "time/elapsed_s": now - self.start}, step=counts["frames"])
            self.last_time, self.last_frames = now, counts["frames"]


def wait_for_evaluation(rank: int, stats: SharedStats, interval: int, stop_event) -> None:
    """Wait while training is a whole evaluation interval past the weights being evaluated; count the wait."""
    start = time.monotonic()
    while stats.eval_behind(interval) and not stop_event.wait(0.01):
        pass
    stats.add_eval_wait(rank, time.monotonic() - start)


def worker_main(rank: int, incarnation: int, cfg_dict: dict, global_model, optimizer, num_actions: int,
                stats: SharedStats, stop_event) -> None:
    """Train until the frame target or the stop event; worker 0 then runs the final greedy evaluation."""
    process_setup()
    cfg = OmegaConf.create(cfg_dict)
    seed = cfg.seed + 1000 * rank + 100_000 * incarnation  # a restarted worker plays new games
    torch.manual_seed(seed)
    settings = AtariSettings.from_config(cfg.env)
    env = AtariBatch(settings, cfg.env.envs_per_worker, seed)
    local = build_model(cfg, num_actions)
    learner = A3CLearner.from_config(cfg, local, global_model, optimizer)
    rollout = Rollout(env, cfg.a3c.t_max)
    frames_per_rollout = cfg.env.envs_per_worker * cfg.a3c.t_max * settings.frame_skip
    reporter = None
    if rank == 0:
        logger = make_logger(cfg.logger.backend, cfg.run_dir, rank=rank, config=cfg_dict)
        reporter = Reporter(logger, stats, settings.frame_skip, cfg.logger.interval_s)
    losses: dict[str, float] = {}
    eval_interval = cfg.eval.interval_frames
    try:
        while not stop_event.is_set() and stats.frames < cfg.total_frames:
            if eval_interval and stats.eval_behind(eval_interval):
                wait_for_evaluation(rank, stats, eval_interval, stop_event)
            learner.sync()
            batch, finished = rollout.collect(local)
            losses = learner.update(batch, rollout.start_state)
            for _, score, length in finished:
                stats.add_episode(rank, score, length)
            stats.add_progress(rank, frames_per_rollout, cfg.a3c.minibatches)
            if reporter is not None:
                reporter.report(losses)
        if reporter is not None and not stop_event.is_set() and cfg.eval.final_episodes:
            learner.sync()
            scores = greedy_episodes(local, eval_settings(cfg, cfg.eval.max_episode_frames), cfg.eval.final_episodes,
                                     cfg.seed + 104_729, should_stop=stop_event.is_set)
            if scores is not None:
                frames = stats.frames
                stats.set_final_eval(frames, float(np.mean(scores)), float(np.std(scores)), len(scores))
                reporter.logger.log({"eval/final_return": float(np.mean(scores)),
                                     "eval/final_return_std": float(np.std(scores))}, step=frames)
    finally:
        if reporter is not None:
            reporter.report(losses, force=bool(losses))
            reporter.logger.close()
        env.close()
