"""The seam between the training loop and where its parts run, and nothing else: the interface an engine offers.

An engine owns the collector(s), the replay buffer and the learner; the loop (offpolicy/loop.py) only calls the
instance methods below, the same way for every engine. Before an engine exists, the config check, the run, the
collector and the planner ask its class what differs by engine (its checked config, what a run sets up for it, the
learner's threads and device, how many collectors share a batch, whether a collector's policy runs on the CPU, what
the planner models);
none of them compares the engine's name or imports an engine module (offpolicy/engines/__init__.py finds the class by
name).

Local (engines/local.py) runs everything in this process; Ray (engines/ray.py) runs collector actors that write into
a replay actor, and learner ranks that average their gradients with torch.distributed.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import torch
from omegaconf import DictConfig

from offpolicy.collect.statistics import Rollout
from shared.config import ConfigError


class LearnerLost(RuntimeError):
    """The learner is gone (a Ray rank died) and no learner state exists at the current frame count."""


@dataclass(frozen=True)
class RunNeeds:
    """What a run sets up for an engine before it builds it (:meth:`Engine.run_needs`)."""

    threads: int  # torch intra-op threads of the learner, started before the run's first parallel op
    device: torch.device  # where the learner computes: the algorithm's parts are built for it
    env_copies: int  # training env copies the run builds as torchrl envs (the engine's other copies are its own)
    # the setting that makes this process spawn children (which import ``__main__`` again), None: none; the run
    # checks for a ``__main__`` guard before the first child
    spawns: str | None = None


class Engine(ABC):
    """Collector, replay and learner of one run, wherever they live; built from the run's
    :class:`~offpolicy.builder.Builder`, the training env, the algorithm's parts, the run directory and the env seed."""

    policy_lag = 0  # rounds the collected transitions lag behind the publications: round k carries version k - lag
    # the replay buffer lives in the training process and each env's transitions reach it in order (what
    # ``replay.frames_once`` needs to rebuild frame stacks from one stream per env)
    replay_in_process = True

    @classmethod
    def check_config(cls, cfg: DictConfig) -> None:
        """Raise a ConfigError (one line: the key and what is allowed) for a setting this engine cannot run. This one
        checks what any engine's learner must offer (CUDA graphs: one CUDA learner); an engine adds its own checks
        after calling it."""
        if cfg.compile.cudagraphs and not (cfg.compile.enabled is True and cls.learner_device(cfg).type == "cuda"
                                           and cls.learner_ranks(cfg) == 1):
            raise ConfigError("compile.cudagraphs=true is not allowed here; allowed: with compile.enabled=true on a "
                              "CUDA learner (engine=ray ray.backend=nccl ray.world_size=1)")

    @classmethod
    def learner_threads(cls, cfg: DictConfig) -> int:
        """torch intra-op threads of this run's learner (``threads``): a number as given; ``auto`` (the default) every
        core the learner can have (:meth:`learner_cores`): more threads make the learner step faster, never slower
        (docs/results.md)."""
        return cfg.threads if cfg.threads != "auto" else cls.learner_cores(cfg)

    @staticmethod
    @abstractmethod
    def learner_cores(cfg: DictConfig) -> int:
        """The CPU cores a learner (each learner rank) of this engine can have, at least one."""

    @staticmethod
    @abstractmethod
    def learner_device(cfg: DictConfig) -> torch.device:
        """The device the learner computes on."""

    @staticmethod
    @abstractmethod
    def learner_ranks(cfg: DictConfig) -> int:
        """Learners that share each optimiser step (each samples its share of ``optim.batch_size``)."""

    @staticmethod
    @abstractmethod
    def collectors(cfg: DictConfig) -> int:
        """Collectors that share each batch of ``collector.env_steps_per_batch`` transitions, each stepping
        ``env.num_envs`` envs."""

    @staticmethod
    @abstractmethod
    def collects_on_cpu(cfg: DictConfig) -> bool:
        """Whether a collector's policy runs on the CPU (the lean collector needs it)."""

    @staticmethod
    @abstractmethod
    def plan(cfg: DictConfig) -> dict:
        """What the planner (offpolicy/tools/plan.py) models of where the parts run: ``collectors``,
        ``learner_ranks``, ``learner_backend``, ``collector_cpus``, ``collector_gpus``, ``learner_gpus``, ``resources``
        (:meth:`resources`) and ``ray_actors`` (whether the parts are Ray actors, whose messaging each round pays)."""

    @staticmethod
    @abstractmethod
    def resources(cfg: DictConfig) -> dict[str, float]:
        """CPUs and GPUs the run's collectors and learners reserve."""

    @classmethod
    @abstractmethod
    def run_needs(cls, cfg: DictConfig) -> RunNeeds:
        """What a run of ``cfg`` sets up before it builds this engine, in one answer."""

    @staticmethod
    def describe_failure(exc: BaseException) -> str | None:
        """One line for a failure of this engine's parts that ends the run (exit 4); None: not one (re-raised)."""
        return None

    @abstractmethod
    def collect(self) -> Rollout:
        """Collect one batch (``collector.env_steps_per_batch`` transitions) with the published policy (the one
        before it, with a :attr:`policy_lag` of 1) and write it, flattened ``[B, T] -> [B*T]``, into replay."""

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
