"""Where the parts run: the local builders (env, collector, replay buffer, trainer), one function each.

The Ray engine (ray_engine.py) swaps the collector and the replay buffer for Ray actors and gives
:func:`make_trainer` torchrl's ``learner_backend="ray"``; train.py runs one loop over either.
"""
from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path

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


def _pixels(cfg: DictConfig) -> dict:
    return {"from_pixels": cfg.env.from_pixels, "image_size": cfg.env.image_size}


def make_train_env(cfg: DictConfig, obs_norm_state: dict | None = None):
    """The training env: ``cfg.env.num_envs`` copies stepped together (in this process or one process each,
    ``env.vector``), seeded with ``cfg.seed``; with ``env.obs_norm`` observations are standardised with statistics
    from ``obs_norm_state`` (a resumed run's) or from ``env.obs_norm_init_steps`` random-action steps."""
    from torchrl.envs import Compose, InitTracker, ParallelEnv, SerialEnv, StepCounter, TransformedEnv

    n = cfg.env.num_envs
    if is_atari(cfg) or n == 1:  # AtariVectorEnv batches its games itself
        base = make_env(cfg.env.name, seed=cfg.seed, num_envs=n, atari=_atari_settings(cfg), train=True,
                        **_pixels(cfg))
    else:
        batched = ParallelEnv if cfg.env.vector == "process" else SerialEnv
        base = batched(n, partial(make_env, cfg.env.name, seed=cfg.seed, train=True, **_pixels(cfg)))
        base.set_seed(cfg.seed)  # copy i gets seed + i
    # StepCounter: episode lengths for train/episode_length; InitTracker: Ornstein-Uhlenbeck noise resets on is_init
    env = base if isinstance(base, TransformedEnv) else TransformedEnv(base)  # nesting TransformedEnvs warns
    env.append_transform(Compose(StepCounter(), InitTracker()))
    if cfg.env.obs_norm:
        norm = _obs_norm(obs_norm_state)
        env.append_transform(norm)
        if obs_norm_state is None:
            reduce_dim = tuple(range(len(env.batch_size) + 1))  # batch dims + time
            norm.init_stats(num_iter=cfg.env.obs_norm_init_steps, reduce_dim=reduce_dim, cat_dim=len(env.batch_size))
    return env


def obs_norm_state(env) -> dict | None:
    """The ObservationNorm statistics of a training env (None without ``env.obs_norm``), for checkpoints and the
    evaluation env."""
    from torchrl.envs import ObservationNorm

    norms = [t for t in env.transform if isinstance(t, ObservationNorm)]
    return {k: v.clone() for k, v in norms[0].state_dict().items()} if norms else None


def make_eval_env(cfg: DictConfig, *, render: bool = False, obs_norm: dict | None = None):
    """The evaluation env: one copy, seeded apart from training; Atari plays whole games with raw scores.
    ``obs_norm`` (from :func:`obs_norm_state`) standardises observations as in training."""
    env = make_env(cfg.env.name, seed=cfg.seed + 10_000, num_envs=1, render=render, atari=_atari_settings(cfg),
                   train=False, **_pixels(cfg))
    if obs_norm is not None:
        env.append_transform(_obs_norm(obs_norm))
    return env


def _obs_norm(state: dict | None):
    """ObservationNorm on "observation": fixed statistics from ``state``, or uninitialised (``init_stats`` follows)."""
    from torchrl.envs import ObservationNorm

    if state is None:
        return ObservationNorm(in_keys=["observation"], standard_normal=True)
    return ObservationNorm(loc=state["loc"].clone(), scale=state["scale"].clone(), in_keys=["observation"],
                           standard_normal=True)


def make_collector(cfg: DictConfig, env, policy):
    """A local ``Collector`` running the stochastic policy; transitions carry the ``policy_version`` they were
    collected with (bumped by every weight publication)."""
    from torchrl.collectors import Collector
    from torchrl.envs.llm.transforms import PolicyVersion
    from torchrl.envs.utils import ExplorationType

    # an explicit PolicyVersion: track_policy_version=True refuses batched (Serial/Parallel) envs
    return Collector(env, policy, frames_per_batch=cfg.collector.frames_per_batch, total_frames=-1,
                     exploration_type=ExplorationType.RANDOM, track_policy_version=PolicyVersion(),
                     auto_register_policy_transforms=False)


def replay_scratch_dir(cfg: DictConfig, run_dir: Path) -> Path:
    """Where a memmap replay keeps its files: ``replay.scratch_dir`` or ``<run_dir>/replay``."""
    return Path(cfg.replay.scratch_dir) if cfg.replay.scratch_dir else Path(run_dir) / "replay"


def make_replay_buffer(cfg: DictConfig, run_dir: Path | None = None):
    """The replay buffer: FIFO of ``replay.size`` transitions in RAM or memory-mapped files (``replay.storage``),
    sampled uniformly, by priority (``replay.prioritized``) or as sub-trajectories of ``replay.slice_len`` steps
    (``optim.batch_size / slice_len`` of them, so each step still replays ``batch_size`` transitions)."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler, SliceSampler

    size = cfg.replay.size
    if cfg.replay.storage == "memmap":
        # existsok: a rerun into the same directory overwrites it (torchrl refuses an existing dir by default)
        storage = LazyMemmapStorage(size, scratch_dir=str(replay_scratch_dir(cfg, run_dir)), existsok=True)
    else:
        storage = LazyTensorStorage(size)
    # sub-trajectories are told apart by the collector's trajectory ids; each slice ends with truncated=True, so the
    # value estimator bootstraps there and never across slices
    slices = {"slice_len": cfg.replay.slice_len, "traj_key": ("collector", "traj_ids"),
              "truncated_key": ("next", "truncated"), "strict_length": True}
    if cfg.replay.prioritized:
        from offpolicy.prioritized import TorchPrioritizedSampler, TorchPrioritizedSliceSampler

        priorities = {"max_capacity": size, "alpha": cfg.replay.alpha, "beta": cfg.replay.beta}
        if cfg.replay.slice_len:
            sampler = TorchPrioritizedSliceSampler(**priorities, **slices)
        else:
            sampler = TorchPrioritizedSampler(**priorities)
    elif cfg.replay.slice_len:
        sampler = SliceSampler(**slices)
    else:
        sampler = RandomSampler()
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=cfg.optim.batch_size)


def replay_state(cfg: DictConfig, replay) -> dict:
    """The replay buffer's checkpoint state; a memmap buffer's data stays in its scratch dir (only its length,
    cursor and sampler state go into the checkpoint)."""
    state = replay.state_dict()
    if cfg.replay.storage == "memmap":
        state["_storage"] = {k: v for k, v in state["_storage"].items() if k != "_storage"}
    return state


def restore_replay(cfg: DictConfig, replay, state: dict, run_dir: Path) -> None:
    """Load :func:`replay_state`; a memmap buffer reopens the files in its scratch dir."""
    if cfg.replay.storage == "memmap":
        from tensordict import TensorDict

        data = TensorDict.load_memmap(replay_scratch_dir(cfg, run_dir))
        replay.storage._storage = data  # torchrl has no public "reopen"; load_state_dict below then copies in place
        state = {**state, "_storage": {**state["_storage"], "_storage": data.state_dict()}}
    replay.load_state_dict(state)


def _as_slices(sample, *, slice_len: int):
    """A sliced sample ``[batch_size]`` as ``[batch_size / slice_len, slice_len]``: the value estimators run along
    the last dim (done after sampling: a replay transform that reshapes breaks torchrl's index/weight write-back)."""
    return sample.reshape(-1, slice_len)


def sample_shape(cfg: DictConfig) -> tuple[int, ...]:
    """Shape of a sampled optimisation batch: ``[batch_size]``, or ``[batch_size / slice_len, slice_len]``."""
    if cfg.replay.slice_len:
        return (cfg.optim.batch_size // cfg.replay.slice_len, cfg.replay.slice_len)
    return (cfg.optim.batch_size,)


def optim_steps_per_batch(cfg: DictConfig) -> int:
    """Optimiser steps after each collected batch: ``utd_ratio * frames_per_batch``."""
    return round(cfg.optim.utd_ratio * cfg.collector.frames_per_batch)


def make_trainer(cfg: DictConfig, parts: AlgoParts, collector, replay_buffer, learner_options: dict | None = None):
    """The algorithm's torchrl trainer: the local learner, or with ``learner_options`` (ray_engine.learner_options)
    torchrl's Ray learner group. Logging is done by our hooks (namespaced metrics), so the trainer's own logging
    hooks are off."""
    with warnings.catch_warnings():
        # torchrl 0.14.1 warns that every *Trainer is experimental and that its own hook stages are deprecated
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        trainer = _trainer(cfg, parts, collector, replay_buffer, learner_options)
    if cfg.replay.slice_len:  # after the trainer's own sampling hook
        trainer.register_op("process_optim_batch", partial(_as_slices, slice_len=cfg.replay.slice_len))
    if parts.stepper is not None and trainer.optimization_stepper is None and learner_options is None:
        # torchrl 0.14.1's SACTrainer and DDPGTrainer do not pass an optimization_stepper on to the base Trainer
        trainer.optimization_stepper = parts.stepper
        parts.stepper.register(trainer)
    return trainer


def _trainer(cfg: DictConfig, parts: AlgoParts, collector, replay_buffer, learner_options: dict | None):
    return parts.trainer_cls(
        collector=collector,
        total_frames=cfg.total_frames,
        frame_skip=1,
        optim_steps_per_batch=optim_steps_per_batch(cfg),
        loss_module=parts.loss,
        target_net_updater=parts.target_updater,
        replay_buffer=replay_buffer,
        batch_size=cfg.optim.batch_size,
        learner_backend="local" if learner_options is None else "ray",
        learner_backend_options=learner_options,
        clip_grad_norm=cfg.optim.max_grad_norm is not None,
        clip_norm=cfg.optim.max_grad_norm,
        progress_bar=cfg.logger.progress_bar,
        seed=None,  # seeded in train.py before the networks are built
        enable_logging=False,
        auto_log_optim_steps=False,
        **parts.trainer_kwargs,
    )
