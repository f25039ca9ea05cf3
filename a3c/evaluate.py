"""Greedy evaluation of the A3C model: the function, the background evaluator process, and the CLI.

``python -m a3c.evaluate checkpoint=<path> episodes=10 video=true`` prints the mean and std return.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import OmegaConf

from a3c.child_process import process_setup
from a3c.model import build_model, checkpoint_model, read_checkpoint
from a3c.rollout import reset_where
from shared.config import run_cli
from shared.atari import AtariBatch, AtariSettings
from shared.evaluation import evaluate_cli_args, evaluation_dir, return_stats, write_evaluation, write_video
from shared.models import AtariActorCritic
from shared.schema import key

VIDEO_SCALE = 4  # agent-view frames (84x84) are upscaled for viewing


def eval_settings(cfg, max_episode_frames: int) -> AtariSettings:
    """The training env stack, with the evaluation's episode cap."""
    return dataclasses.replace(AtariSettings.from_config(cfg.env), max_episode_frames=max_episode_frames)


def _video_frame(obs: np.ndarray, grayscale: bool) -> np.ndarray:
    frame = obs[-1] if grayscale else obs[-3:].transpose(1, 2, 0)  # the newest frame of the stack
    return frame.repeat(VIDEO_SCALE, 0).repeat(VIDEO_SCALE, 1)


@torch.no_grad()
def greedy_episodes(model: AtariActorCritic, settings: AtariSettings, episodes: int, seed: int, *,
                    video_path: Path | None = None,
                    should_stop: Callable[[], bool] = lambda: False) -> list[float] | None:
    """Play ``episodes`` games in parallel with the argmax action; return their scores (None if stopped early).

    With ``video_path`` the first game is written as an mp4 of what the agent sees."""
    env = AtariBatch(settings, episodes, seed)
    scores: list[float | None] = [None] * episodes
    frames = []
    state = model.initial_state(episodes)
    try:
        obs = env.reset()
        while any(s is None for s in scores):
            if should_stop():
                return None
            if video_path is not None and scores[0] is None:
                frames.append(_video_frame(obs[0], settings.grayscale))
            logits, _, state = model.step(torch.from_numpy(obs), state)
            step = env.step(logits.argmax(-1).numpy())
            state = reset_where(state, step.done)  # a new game or life, as in training
            obs = step.obs
            for index, score, _ in step.finished:
                if scores[index] is None:
                    scores[index] = score
    finally:
        env.close()
    if video_path is not None:
        write_video(video_path, frames, fps=30)
    return scores


def evaluator_main(cfg_dict: dict, global_model: AtariActorCritic, num_actions: int, stats, stop_event) -> None:
    """Background evaluator process: greedy episodes of the global weights every ``eval.interval_frames``.

    It only reads the shared weights, and it keeps up: it runs at the workers' priority (a fair share of the CPU
    while it plays), and should training still reach the end of the interval of the weights it plays, the workers
    wait for its result (``SharedStats.eval_behind``). So a result comes at most one interval (plus the rollouts in flight)
    after its weights, and every interval is evaluated. At nice 10 on a saturated 2-core machine it had fallen ~6M
    frames behind at 1M-frame intervals.
    """
    process_setup()
    cfg = OmegaConf.create(cfg_dict)
    settings = eval_settings(cfg, cfg.eval.max_episode_frames)
    model = build_model(cfg, num_actions)
    interval = cfg.eval.interval_frames
    next_at = (stats.frames_unlocked // interval + 1) * interval
    try:
        while not stop_event.wait(0.05):
            frames = stats.frames_unlocked
            if frames < next_at:
                continue
            stats.start_eval(frames)
            model.load_state_dict(global_model.state_dict())
            video = Path(cfg.run_dir) / "videos" / f"eval_{frames}.mp4" if cfg.eval.video else None
            scores = greedy_episodes(model, settings, cfg.eval.episodes, cfg.seed + 7919, video_path=video,
                                     should_stop=stop_event.is_set)
            if scores is None:
                return
            stats.add_eval(frames, float(np.mean(scores)), float(np.std(scores)), len(scores))
            next_at = (frames // interval + 1) * interval  # the next interval, even if training is there already
    finally:
        stats.end_eval()


@dataclasses.dataclass
class EvaluateConfig:
    """The keys of ``python -m a3c.evaluate``."""

    checkpoint: str | None = key(None, "path to a checkpoint written by a3c.train (required)")
    episodes: int = key(10, "greedy episodes, played in parallel", min=1, max=256, integer=True)
    seed: int = key(12345, "seed of the evaluation games (noop starts differ per game)", min=0, integer=True)
    max_episode_frames: int = key(108000, "cap on an episode's emulator frames", min=1, integer=True)
    video: bool = key(False, "write an mp4 of the first episode (needs the video extra)")
    run_dir: str | None = key(None, "where evaluation.json and the video go (default: the checkpoint's run dir)")


EVALUATE_HEADER = """python -m a3c.evaluate checkpoint=<path> [episodes=10] [video=true]: greedy episodes of a saved A3C model.
Generated from a3c/evaluate.py by `python -m a3c.config`: edit the declarations there, not this file."""
_USAGE = "usage: python -m a3c.evaluate checkpoint=<path> [episodes=10] [video=true]"


def main(argv: list[str]) -> int:
    """Evaluate a checkpoint; prints ``return: mean +- std`` and writes evaluation.json (and an mp4)."""
    args = evaluate_cli_args(EvaluateConfig, EVALUATE_HEADER, _USAGE, argv, written_by="a3c.train")
    if args is None:
        return 0
    ckpt = read_checkpoint(args.checkpoint)
    out_dir = evaluation_dir(args)
    cfg, model = checkpoint_model(ckpt)
    video = out_dir / "videos" / f"evaluate_{ckpt['counters']['frames']}.mp4" if args.video else None
    torch.set_num_threads(1)
    scores = greedy_episodes(model, eval_settings(cfg, args.max_episode_frames), args.episodes, args.seed,
                             video_path=video)
    result = {**return_stats(scores), "scores": scores, "frames_trained": ckpt["counters"]["frames"],
              "env": cfg.env.name, "checkpoint": str(args.checkpoint), "video": str(video) if video else None}
    write_evaluation(out_dir, result, f"greedy episodes ({cfg.env.name}, {result['frames_trained']} frames trained)")
    return 0


if __name__ == "__main__":
    run_cli(main)
