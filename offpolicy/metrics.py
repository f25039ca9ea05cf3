"""Namespaced metrics from the per-round report: ``train/`` ``loss/`` ``collector/`` ``replay/`` ``time/`` (``eval/``
comes from the evaluator). What they are computed from passed the round's invariants (offpolicy/invariants.py:
finite losses, rewards and returns) before they are logged."""
from __future__ import annotations

import threading
import time

import torch


class SharedLogger:
    """A MetricLogger shared by the training loop and the evaluation thread (one lock around every write)."""

    def __init__(self, logger):
        self._logger = logger
        self._lock = threading.Lock()

    def log(self, metrics: dict[str, float], step: int) -> None:
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


class RoundMetrics:
    """Logs ``train/return`` etc. after every round that finished episodes, and the rest at most every
    ``interval_s`` (averaged over the rounds since the last log); moves the progress bar (``bar``, a tqdm or None)
    with the latest train and eval returns."""

    def __init__(self, logger: SharedLogger, *, interval_s: float, action_bounds, exploration_value, bar=None,
                 last_eval=lambda: None):
        self.logger = logger
        self.bar = bar
        self.last_eval = last_eval
        self.interval_s = interval_s
        self.low, self.high = action_bounds if action_bounds is not None else (None, None)
        self.exploration_value = exploration_value
        self.last_return: float | None = None
        self.compile_recompiles: int | None = None  # the compiled learner's latest count (None: not compiled)
        self._last_log = -float("inf")
        self._window = self._new_window()

    @staticmethod
    def _new_window() -> dict:
        return {"env_steps": 0, "optim_steps": 0, "collect_s": 0.0, "learn_s": 0.0, "losses": {}, "n_loss": 0}

    def log(self, report, progress) -> None:
        """Log what ``report`` (one round) says; ``progress`` holds the run's counters after it."""
        r, env_steps = report.rollout, progress.env_steps
        w = self._window
        w["env_steps"] += r.env_steps
        w["optim_steps"] += report.steps_done
        w["collect_s"] += report.collect_s
        w["learn_s"] += report.learn_s
        if report.learned:
            for key, value in report.learned.items():
                if key.startswith("loss/"):
                    w["losses"][key] = w["losses"].get(key, 0.0) + value
            w["n_loss"] += 1
            w["latest"] = {k: v for k, v in report.learned.items() if k.startswith(("replay/", "compile/"))}
            if "compile/recompiles" in report.learned:
                self.compile_recompiles = int(report.learned["compile/recompiles"])
        if r.returns:
            self.last_return = sum(r.returns) / len(r.returns)
            self.logger.log({"train/return": self.last_return,
                             "train/episode_length": sum(r.lengths) / len(r.lengths),
                             "train/episodes": float(progress.episodes)}, env_steps)
        if self.bar is not None:
            self.bar.update(r.env_steps)
            shown = {"return": self.last_return, "eval": self.last_eval()}
            shown = {k: v if isinstance(v, str) else f"{v:.1f}" for k, v in shown.items() if v is not None}
            self.bar.set_postfix(shown, refresh=False)
        now = time.perf_counter()
        if now - self._last_log < self.interval_s:
            return
        self._last_log = now
        wall = w["collect_s"] + w["learn_s"]
        m = {
            "train/env_steps": float(env_steps),
            "train/optim_steps": float(progress.optim_steps),
            "train/utd_ratio": progress.optim_steps / max(env_steps, 1),
            "train/exploration": self.exploration_value(),
            "collector/env_steps_per_s": w["env_steps"] / max(w["collect_s"], 1e-9),
            "collector/policy_version": float(report.published),
            "collector/actors": float(r.collectors),
            "collector/reward": r.reward_sum / max(r.env_steps, 1),
            "replay/size": float(report.replay_size),
            "replay/write_count": float(report.replay_writes),
            "time/elapsed_s": progress.elapsed_s,
            "time/cpu_s": time.process_time(),  # this process's CPU time: throughput on a shared machine
            "time/env_steps_per_s": w["env_steps"] / max(wall, 1e-9),
            "time/updates_per_s": w["optim_steps"] / max(w["learn_s"], 1e-9),
            "time/collect_frac": w["collect_s"] / max(wall, 1e-9),
        }
        if r.actions is not None and r.actions.shape[0] > 1:
            m.update({f"collector/{k}": v for k, v in action_stats(r.actions, self.low, self.high).items()
                      if not k.startswith("action_std_")})
        m.update(w.get("latest", {}))  # the last round's replay/ and compile/ figures
        if w["n_loss"]:
            m.update({k: v / w["n_loss"] for k, v in w["losses"].items()})
        self.logger.log(m, env_steps)
        self._window = self._new_window()
