"""The seam between the training loop and where its parts run. An engine owns the collector(s), the replay buffer and
the learner; the loop (offpolicy/loop.py) only calls the methods below, the same way for every engine.

Local (engines/local.py) runs everything in this process; Ray (engines/ray.py) runs collector actors that write into
a replay actor, and learner ranks that average their gradients with torch.distributed.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch


class LearnerLost(RuntimeError):
    """The learner is gone (a Ray rank died) and no learner state exists at the current frame count."""


@dataclass
class Rollout:
    """What one round of collection brought: counts, finished episodes, the policy versions it was collected with
    (None when nothing was collected), rewards and actions (for the action statistics)."""

    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    version_lo: int | None = None
    version_hi: int | None = None
    reward_sum: float = 0.0
    actions: torch.Tensor | None = None
    collectors: int = 1

    @staticmethod
    def merge(parts: list["Rollout"]) -> "Rollout":
        """One round's rollout from several collectors' rollouts."""
        versions = [(p.version_lo, p.version_hi) for p in parts if p.version_lo is not None]
        actions = [p.actions for p in parts if p.actions is not None and len(p.actions)]
        return Rollout(env_steps=sum(p.env_steps for p in parts), returns=[r for p in parts for r in p.returns],
                       lengths=[n for p in parts for n in p.lengths],
                       version_lo=min(v[0] for v in versions) if versions else None,
                       version_hi=max(v[1] for v in versions) if versions else None,
                       reward_sum=sum(p.reward_sum for p in parts),
                       actions=torch.cat(actions) if actions else None, collectors=len(parts))


class RolloutStats:
    """Called on every collected (flattened) batch: counts transitions, keeps finished episodes, the policy versions
    and the actions, until :meth:`drain` returns them as a :class:`Rollout`. Runs in this process (local) or inside
    each Ray collector actor (its ``post_collect_hook``)."""

    def __init__(self):
        self.pending: list = []

    def __call__(self, batch) -> None:
        self.pending.append(batch)

    def drain(self) -> Rollout:
        """This round's statistics; starts a new round."""
        batches, self.pending = self.pending, []
        if not batches:
            return Rollout()
        batch = torch.cat([b.reshape(-1) for b in batches]) if len(batches) > 1 else batches[0].reshape(-1)
        nxt = batch.get("next")
        if "game_over" in nxt.keys():  # Atari: whole games with raw scores, not the (per-life) training episodes
            done, returns, lengths = (nxt.get(k).reshape(-1) for k in ("game_over", "game_score", "game_length"))
        else:
            done, returns, lengths = (nxt.get(k).reshape(-1) for k in ("done", "episode_reward", "step_count"))
        versions = nxt.get("policy_version")  # the root key lags one step behind
        return Rollout(env_steps=batch.numel(), returns=returns[done].float().tolist(),
                       lengths=lengths[done].float().tolist(),
                       version_lo=int(versions.min()), version_hi=int(versions.max()),
                       reward_sum=float(nxt.get("reward").float().sum()),
                       actions=batch.get("action").reshape(batch.numel(), -1).float())


class Engine(ABC):
    """Collector, replay and learner of one run, wherever they live."""

    @abstractmethod
    def collect(self) -> Rollout:
        """Collect one batch (``collector.env_steps_per_batch`` transitions) with the published policy and write it,
        flattened ``[B, T] -> [B*T]``, into replay."""

    @abstractmethod
    def replay_size(self) -> int:
        """Transitions in replay now."""

    @abstractmethod
    def replay_writes(self) -> int:
        """Transitions ever written into replay (its ``write_count``)."""

    @abstractmethod
    def update(self, n_steps: int, version: int, stop: Callable[[], bool] | None = None
               ) -> tuple[dict[str, float], int]:
        """``n_steps`` optimiser steps, each followed by its target update; no sampled transition may come from a
        policy newer than ``version``; an engine that can stops between two steps once ``stop()`` is true (the
        learner's count says how many ran). Returns the round's ``loss/`` and ``replay/`` metrics and the learner's
        optimiser-step count."""

    @abstractmethod
    def publish(self) -> int:
        """Send the learner's policy (with the exploration state) to the collectors and bring the evaluation policy
        up to date; returns the collectors' policy version (publications so far)."""

    @abstractmethod
    def learner_state(self) -> dict:
        """The learner's checkpoint state (networks, optimisers, counters)."""

    @abstractmethod
    def restore(self, learner_state: dict, version: int) -> None:
        """Load a checkpoint's learner state; the collectors continue from policy version ``version``."""

    @abstractmethod
    def replay_state(self) -> dict | None:
        """The replay buffer's checkpoint state (None: this engine's replay is not checkpointed)."""

    @abstractmethod
    def restore_replay(self, state: dict) -> None:
        """Load :meth:`replay_state`."""

    def collector_restarts(self) -> int:
        """Collectors replaced after they died, in this process (only Ray's can die on their own)."""
        return 0

    def describe(self) -> str:
        """Where the parts run, for the start-up line ("" for this process)."""
        return ""

    @abstractmethod
    def close(self) -> None:
        """Stop the collectors and release everything the engine started."""
