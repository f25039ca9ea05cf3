"""Namespaced metrics from the training loop: ``train/`` ``loss/`` ``collector/`` ``replay/`` ``time/``
(``eval/`` comes from the evaluator). Every value passes the finite-metric invariant before it is logged."""
from __future__ import annotations

import threading
import time
from collections import defaultdict

import torch

from offpolicy.invariants import check_finite


class SharedLogger:
    """A MetricLogger shared by the training loop and the evaluation thread (one lock around every write)."""

    def __init__(self, logger):
        self._logger = logger
        self._lock = threading.Lock()

    def log(self, metrics: dict[str, float], step: int) -> None:
        check_finite(metrics)
        with self._lock:
            self._logger.log(metrics, step)

    def close(self) -> None:
        with self._lock:
            self._logger.close()


def action_stats(actions: torch.Tensor, low: torch.Tensor | None, high: torch.Tensor | None) -> dict[str, float]:
    """Per-dimension std (``action_std_<i>`` and their mean ``action_std``) and, for bounded actions, the fraction of
    entries within 1 % of the range from a bound (``action_saturation``)."""
    a = actions.reshape(-1, actions.shape[-1]).float()
    std = a.std(0) if a.shape[0] > 1 else torch.zeros(a.shape[-1])
    out = {f"action_std_{i}": float(s) for i, s in enumerate(std)}
    out["action_std"] = float(std.mean())
    if low is not None:
        margin = 0.01 * (high - low)
        out["action_saturation"] = float(((a <= low + margin) | (a >= high - margin)).float().mean())
    return out


class Metrics:
    """Trainer hooks that turn batches, losses and timings into namespaced metrics, log them, and feed tqdm."""

    def __init__(self, trainer, logger: SharedLogger, *, interval_s: float, action_spec, discrete: bool,
                 exploration_value, start_episodes: int = 0, start_elapsed_s: float = 0.0):
        self.trainer = trainer
        self.logger = logger
        self.interval_s = interval_s
        bounded = not discrete and hasattr(action_spec, "space") and hasattr(action_spec.space, "low")
        self.low = action_spec.space.low.float() if bounded else None
        self.high = action_spec.space.high.float() if bounded else None
        self.exploration_value = exploration_value
        self.episodes = start_episodes
        self.last_return: float | None = None
        self.last_eval: float | None = None
        self.start_elapsed_s = start_elapsed_s
        self._t0 = time.perf_counter()
        self._t_cycle = self._t0
        self._t_batch = self._t0
        self._last_log = -float("inf")
        self._window = self._new_window()
        self._last_sample = None
        self._last_batch = None

    def _new_window(self):
        return {"frames": 0, "optim0": self.trainer._optim_count, "collect_s": 0.0, "learn_s": 0.0, "losses": defaultdict(float), "n_loss": 0}

    def register(self, trainer) -> None:
        trainer.register_op("batch_process", self.on_batch)
        trainer.register_op("process_optim_batch", self.on_sample)
        trainer.register_op("post_optim_complete_log", self.on_losses)
        trainer.register_op("post_steps_log", self.on_batch_done)

    @property
    def elapsed_s(self) -> float:
        return self.start_elapsed_s + time.perf_counter() - self._t0

    def on_batch(self, batch):
        now = time.perf_counter()
        self._window["collect_s"] += now - self._t_cycle
        self._window["frames"] += batch.numel()
        self._t_batch = now
        self._last_batch = batch
        return batch

    def on_sample(self, sample):
        self._last_sample = sample
        return sample

    def on_losses(self, optim_steps, average_losses):
        if average_losses is not None:
            for key, value in average_losses.items():
                if value.numel() == 1:  # DDPGLoss also returns per-sample diagnostics
                    self._window["losses"][key] += float(value)
            self._window["n_loss"] += 1

    def on_batch_done(self, batch) -> dict:
        """Log train/ every batch that finished episodes, and the rest at most every ``interval_s``."""
        now = time.perf_counter()
        self._window["learn_s"] += now - self._t_batch
        frames = self.trainer.collected_frames
        done = batch["next", "done"].squeeze(-1)
        if done.any():
            returns = batch["next", "episode_reward"].squeeze(-1)[done]
            lengths = batch["next", "step_count"].squeeze(-1)[done].float()
            self.episodes += int(done.sum())
            self.last_return = float(returns.mean())
            self.logger.log({"train/return": self.last_return, "train/episode_length": float(lengths.mean()),
                             "train/episodes": float(self.episodes)}, frames)
        if now - self._last_log >= self.interval_s:
            self._last_log = now
            self.logger.log(self._window_metrics(batch), frames)
            self._window = self._new_window()
        self._t_cycle = time.perf_counter()
        pbar = {"log_pbar": True}
        if self.last_return is not None:
            pbar["return"] = self.last_return
        if self.last_eval is not None:
            pbar["eval"] = self.last_eval
        return pbar

    def _window_metrics(self, batch) -> dict[str, float]:
        w = self._window
        trainer = self.trainer
        frames = trainer.collected_frames
        wall = w["collect_s"] + w["learn_s"]
        m = {
            "train/frames": float(frames),
            "train/optim_steps": float(trainer._optim_count),
            "train/utd_ratio": trainer._optim_count / max(frames, 1),
            "train/exploration": self.exploration_value(),
            "collector/fps": w["frames"] / max(w["collect_s"], 1e-9),
            "collector/policy_version": float(trainer.collector.policy_version or 0),
            "collector/reward": float(batch["next", "reward"].float().mean()),
            "replay/size": float(len(trainer.replay_buffer)),
            "replay/write_count": float(trainer.replay_buffer.write_count),
            "time/elapsed_s": self.elapsed_s,
            "time/cpu_s": time.process_time(),  # this process's CPU time: throughput on a shared machine
            "time/sps": w["frames"] / max(wall, 1e-9),
            "time/updates_per_s": (trainer._optim_count - w["optim0"]) / max(w["learn_s"], 1e-9),
            "time/collect_frac": w["collect_s"] / max(wall, 1e-9),
        }
        m.update({f"collector/{k}": v for k, v in action_stats(batch["action"], self.low, self.high).items()
                  if not k.startswith("action_std_")})
        if self._last_sample is not None:
            sample = self._last_sample
            m.update({f"replay/{k}": v for k, v in action_stats(sample["action"], self.low, self.high).items()})
            m["replay/reward"] = float(sample["next", "reward"].float().mean())
        if w["n_loss"]:
            m.update({f"loss/{k}": v / w["n_loss"] for k, v in w["losses"].items()})
        return m
