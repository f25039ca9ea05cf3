"""The local engine: collector, replay buffer and learner in this process (our lean collector or torchrl's
``Collector``, a torchrl replay buffer, and :class:`offpolicy.learner.Learner`)."""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig

from offpolicy.algos import AlgoParts
from offpolicy.learner import make_learner
from offpolicy.collection import LeanCollector, lean_collection
from offpolicy.engines.base import Engine, Rollout, RolloutStats
from offpolicy.envs import for_replay, obs_norm_state
from shared import compat
from offpolicy.replay import (ReplayJournal, journal_dir, make_replay_buffer, replay_scratch_dir, replay_state,
                              restore_replay, sample_shape)


def make_collector(cfg: DictConfig, env, policy, seed: int | None = None):
    """The local collector running the stochastic policy on ``env`` (seeded by the caller): our
    :class:`~offpolicy.collection.LeanCollector` where it applies (then seeded ``seed``, default ``cfg.seed``, and
    ``env`` gives only its specs and observation statistics), else torchrl's ``Collector``. Transitions carry the
    ``policy_version`` they were collected with (bumped by every weight publication). With ``compile.enabled`` the
    policy runs under torch.compile too (one CartPole step of DQN's policy: ~70 against ~120 µs, one check on a busy
    machine)."""
    if lean_collection(cfg):
        if cfg.compile.enabled:
            policy = torch.compile(policy, mode=cfg.compile.mode)
        return LeanCollector(cfg, env, policy, cfg.seed if seed is None else seed, obs_norm_state(env))
    from torchrl.collectors import Collector
    from torchrl.envs.llm.transforms import PolicyVersion
    from torchrl.envs.utils import ExplorationType

    compiled = ({"mode": cfg.compile.mode} if cfg.compile.mode else True) if cfg.compile.enabled else False
    # an explicit PolicyVersion: track_policy_version=True refuses batched (Serial/Parallel) envs
    return Collector(env, policy, frames_per_batch=cfg.collector.env_steps_per_batch, total_frames=-1,
                     exploration_type=ExplorationType.RANDOM, track_policy_version=PolicyVersion(),
                     auto_register_policy_transforms=False, compile_policy=compiled)


class LocalEngine(Engine):
    """Everything in this process: the collector runs ``parts.collect_policy`` itself on ``env`` (seeded by the
    caller with ``seed``), so publishing only bumps its policy version."""

    def __init__(self, cfg: DictConfig, env, parts: AlgoParts, run_dir: Path, seed: int):
        self.cfg, self.run_dir = cfg, run_dir
        self.collector = make_collector(cfg, env, parts.collect_policy, seed)
        self.replay = make_replay_buffer(cfg, run_dir)
        # a memmap replay keeps what its writes overwrite until the next checkpoints, so a resume can undo them
        self.journal = ReplayJournal(journal_dir(cfg, run_dir)) if cfg.replay.storage == "memmap" else None
        self.learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=sample_shape(cfg))
        self.stats = RolloutStats()
        self._batches = iter(self.collector)

    def collect(self) -> Rollout:
        batch = for_replay(next(self._batches))
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
