"""Where the parts run: the local builders (env, collector, replay buffer, trainer), one function each.

The Ray engine swaps these builders (RayCollector, RayReplayBuffer, ``learner_backend="ray"``) without a second
copy of the loop in train.py.
"""
from __future__ import annotations

import warnings

from omegaconf import DictConfig

from offpolicy.algorithms import AlgoParts
from offpolicy.fixes import fast_from_any
from shared.envs import AtariSettings, atari_rom, make_env

fast_from_any()


def is_atari(cfg: DictConfig) -> bool:
    import gymnasium

    return cfg.env.name not in gymnasium.registry and atari_rom(cfg.env.name) is not None


def _atari_settings(cfg: DictConfig) -> AtariSettings:
    return AtariSettings.from_config({"name": cfg.env.name, **cfg.env.atari})


def make_train_env(cfg: DictConfig):
    """The training env: ``cfg.env.num_envs`` copies stepped together, seeded with ``cfg.seed``."""
    from torchrl.envs import InitTracker, StepCounter

    env = make_env(cfg.env.name, seed=cfg.seed, num_envs=cfg.env.num_envs, atari=_atari_settings(cfg), train=True)
    env.append_transform(StepCounter())  # episode lengths for train/episode_length
    env.append_transform(InitTracker())  # Ornstein-Uhlenbeck noise resets on "is_init"
    return env


def make_eval_env(cfg: DictConfig, *, render: bool = False):
    """The evaluation env: one copy, seeded apart from training; Atari plays whole games with raw scores."""
    return make_env(cfg.env.name, seed=cfg.seed + 10_000, num_envs=1, render=render, atari=_atari_settings(cfg),
                    train=False)


def make_collector(cfg: DictConfig, env, policy):
    """A local ``Collector`` running the stochastic policy; transitions carry the ``policy_version`` they were
    collected with (bumped by every weight publication)."""
    from torchrl.collectors import Collector
    from torchrl.envs.utils import ExplorationType

    return Collector(env, policy, frames_per_batch=cfg.collector.frames_per_batch, total_frames=-1,
                     exploration_type=ExplorationType.RANDOM, track_policy_version=True,
                     auto_register_policy_transforms=False)


def make_replay_buffer(cfg: DictConfig):
    """A uniform FIFO replay buffer of ``cfg.replay.size`` transitions, sampling ``cfg.optim.batch_size``."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler

    return TensorDictReplayBuffer(storage=LazyTensorStorage(cfg.replay.size), sampler=RandomSampler(),
                                  batch_size=cfg.optim.batch_size)


def optim_steps_per_batch(cfg: DictConfig) -> int:
    """Optimiser steps after each collected batch: ``utd_ratio * frames_per_batch``."""
    return round(cfg.optim.utd_ratio * cfg.collector.frames_per_batch)


def make_trainer(cfg: DictConfig, parts: AlgoParts, collector, replay_buffer):
    """The algorithm's torchrl trainer with the local learner. Logging is done by our hooks (namespaced metrics),
    so the trainer's own logging hooks are off."""
    with warnings.catch_warnings():
        # torchrl 0.14.1 warns that every *Trainer is experimental and that its own hook stages are deprecated
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        trainer = _trainer(cfg, parts, collector, replay_buffer)
    if parts.stepper is not None and trainer.optimization_stepper is None:
        # torchrl 0.14.1's SACTrainer and DDPGTrainer do not pass an optimization_stepper on to the base Trainer
        trainer.optimization_stepper = parts.stepper
        parts.stepper.register(trainer)
    return trainer


def _trainer(cfg: DictConfig, parts: AlgoParts, collector, replay_buffer):
    return parts.trainer_cls(
        collector=collector,
        total_frames=cfg.total_frames,
        frame_skip=1,
        optim_steps_per_batch=optim_steps_per_batch(cfg),
        loss_module=parts.loss,
        target_net_updater=parts.target_updater,
        replay_buffer=replay_buffer,
        batch_size=cfg.optim.batch_size,
        learner_backend="local",
        clip_grad_norm=cfg.optim.max_grad_norm is not None,
        clip_norm=cfg.optim.max_grad_norm,
        progress_bar=cfg.logger.progress_bar,
        seed=None,  # seeded in train.py before the networks are built
        enable_logging=False,
        auto_log_optim_steps=False,
        **parts.trainer_kwargs,
    )
