"""The local engine: collector, replay buffer and learner in this process (our lean collector or torchrl's
``Collector``, a torchrl replay buffer, and :class:`offpolicy.learner.Learner`, all from the run's builder)."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig

from offpolicy.algos import AlgoParts
from offpolicy.collect.overlap import BackgroundCollector, CollectorLost
from offpolicy.collect.statistics import Rollout, RolloutStats, next_batch
from offpolicy.engines.base import Engine, RunNeeds
from offpolicy.envs import obs_norm_state, reported_env_fault
from offpolicy.replay import ReplayJournal, journal_dir, replay_scratch_dir, replay_state, restore_replay
from shared import compat
from shared.config import ConfigError


class LocalEngine(Engine):
    """Everything in this process: the collector runs ``parts.collect_policy`` itself on ``env`` (seeded by the
    caller with ``seed``), so publishing only bumps its policy version; with ``collector.overlap`` the lean collector
    runs in a child process one batch ahead, on weights handed over with each order (offpolicy/collect/overlap.py)."""

    @classmethod
    def resources(cls, cfg: DictConfig) -> dict[str, float]:
        return {"CPU": float(cls.learner_threads(cfg)), "GPU": 0.0}

    @staticmethod
    def learner_cores(cfg: DictConfig) -> int:
        """The CPUs this process may run on (``OMP_NUM_THREADS`` where set, as torch itself honours it), less one with
        ``collector.overlap`` (its child process collects on that core)."""
        omp = os.environ.get("OMP_NUM_THREADS", "")
        cores = int(omp) if omp.isdigit() and int(omp) > 0 else len(os.sched_getaffinity(0))
        return max(1, cores - (1 if cfg.collector.overlap else 0))

    @staticmethod
    def learner_device(cfg: DictConfig) -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def learner_ranks(cfg: DictConfig) -> int:
        return 1

    @staticmethod
    def collectors(cfg: DictConfig) -> int:
        return 1

    @staticmethod
    def collects_on_cpu(cfg: DictConfig) -> bool:
        return True

    @classmethod
    def plan(cls, cfg: DictConfig) -> dict:
        threads = cls.learner_threads(cfg)  # the collector shares the learner's process (or the core it left free)
        return {"collectors": 1, "learner_ranks": 1, "learner_backend": "local", "collector_cpus": threads,
                "collector_gpus": 0, "learner_gpus": 0, "resources": cls.resources(cfg), "ray_actors": False}

    @classmethod
    def check_config(cls, cfg: DictConfig) -> None:
        from offpolicy.collect.lean import lean_collection

        super().check_config(cfg)
        if cfg.collector.overlap and not (lean_collection(cfg) or cfg.env.kind == "atari"):
            raise ConfigError("collector.overlap=true is not allowed here; allowed: with the lean collector "
                              "(collector.lean=true and a Gymnasium state-vector env stepped in this process) or an "
                              "ALE game")

    @staticmethod
    def describe_failure(exc: BaseException) -> str | None:
        return str(exc) if isinstance(exc, CollectorLost) else None

    @staticmethod
    def training_env_copies(cfg: DictConfig) -> int:
        """What the collector in this process needs (:func:`~offpolicy.collect.lean.torchrl_env_copies`); one, for its
        specs, when the collector runs in a child process (``collector.overlap``)."""
        from offpolicy.collect.lean import torchrl_env_copies

        return 1 if cfg.collector.overlap else torchrl_env_copies(cfg)

    @classmethod
    def run_needs(cls, cfg: DictConfig) -> RunNeeds:
        """This process's learner threads and the CPU, :meth:`training_env_copies`, and the children it spawns: the
        overlapped collector's process, or one process per env copy (a ParallelEnv, offpolicy/envs.py)."""
        spawns = None
        if cfg.collector.overlap:
            spawns = "collector.overlap=true"
        elif (cfg.env.vector == "process" and cfg.env.num_envs > 1 and cfg.env.backend == "gymnasium"
              and cfg.env.kind != "atari"):
            spawns = "env.vector=process"
        return RunNeeds(threads=cls.learner_threads(cfg), device=cls.learner_device(cfg),
                        env_copies=cls.training_env_copies(cfg), spawns=spawns)

    def __init__(self, builder, env, parts: AlgoParts, run_dir: Path, seed: int):
        cfg = self.cfg = builder.cfg
        self.run_dir = run_dir
        self.env = env
        if cfg.collector.overlap:  # the lean collector in a child process, one batch ahead (collect/overlap.py)
            self.collector = BackgroundCollector(builder, parts.collect_policy, seed, obs_norm_state(env))
            self.policy_lag = 1
        else:
            self.collector = builder.collector(env, parts.collect_policy, seed)
        self.replay = builder.replay(run_dir)
        # a memmap replay keeps what its writes overwrite until the next checkpoints, so a resume can undo them
        self.journal = ReplayJournal(journal_dir(cfg, run_dir)) if cfg.replay.storage == "memmap" else None
        self.learner = builder.learner(parts, env.action_spec_unbatched)
        self.stats = RolloutStats()
        self._batches = iter(self.collector)

    def describe(self) -> str:
        return "collection in a child process one batch ahead (collector.overlap); " if self.policy_lag else ""

    def collect(self) -> Rollout:
        batch = next_batch(self._batches, self.env)
        if self.journal is not None:
            self.journal.before_write(self.replay, batch.numel())
        self.replay.extend(batch)
        self.stats(batch)
        return self.stats.drain()

    def replay_size(self) -> int:
        return len(self.replay)

    def replay_writes(self) -> int:
        return self.replay.write_count

    def update(self, n_steps: int, version: int, stop=None) -> tuple[dict[str, float], int]:
        return self.learner.update(self.replay, n_steps, version, stop), self.learner.steps

    def publish(self) -> int:
        self.collector.update_policy_weights_()
        return self.collector.policy_version

    def learner_state(self) -> dict:
        return self.learner.state_dict()

    def restore(self, learner_state: dict, version: int) -> None:
        self.learner.load_state_dict(learner_state)
        self.collector.policy_version_tracker.version = version

    def replay_state(self) -> dict | None:
        if self.journal is not None:
            self.journal.checkpointed(self.replay.write_count)
        return replay_state(self.cfg, self.replay)

    def restore_replay(self, state: dict) -> None:
        if self.journal is not None:  # the files back to what the checkpoint saw (writes after it undone)
            self.journal.roll_back(replay_scratch_dir(self.cfg, self.run_dir), compat.replay_state_write_count(state))
        restore_replay(self.cfg, self.replay, state, self.run_dir)

    def close(self) -> None:
        self.collector.shutdown()
        try:
            self.env.close(raise_if_closed=False)  # the collector may have closed it (the torchrl Collector does)
        except RuntimeError:
            if reported_env_fault(self.env) is None:  # torchrl refuses to close a ParallelEnv whose worker exited
                raise
