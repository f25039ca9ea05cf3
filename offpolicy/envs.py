"""The off-policy engine's envs: the training env (batched, seeded, with step counts, init flags and optional
observation normalisation) and the evaluation env, built on shared/envs.py."""
from __future__ import annotations

import shutil
import tempfile
import weakref
from functools import partial
from pathlib import Path

from omegaconf import DictConfig

from shared.atari import AtariSettings
from shared.env_guard import EnvFault, reported_fault
from shared.envs import make_env


def eval_max_steps(cfg: DictConfig) -> int:
    """Agent steps an evaluation episode may take: Atari plays whole games (to game over, or ALE's cap of
    ``max_episode_frames`` emulator frames, which ends the game itself); other envs ``eval.max_episode_steps``."""
    if cfg.env.kind == "atari":
        settings = atari_settings(cfg.env)
        return settings.max_episode_frames // settings.frame_skip + 1
    return cfg.eval.max_episode_steps


def collector_seed(seed: int, index: int, num_envs: int) -> int:
    """The seed of collector ``index``'s first env (its copies take consecutive seeds): copy ``j`` of collector ``k``
    plays seed ``seed + k * num_envs + j``, so no two copies of a run share a stream, however many there are."""
    return seed + index * num_envs


def eval_seed(seed: int) -> int:
    """The evaluation env's seed: a stream of its own derived from ``seed`` (numpy's SeedSequence), away from the
    training copies' consecutive ``seed + i`` (a fixed offset such as seed + 10,000 collides once a run has more
    copies)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, EVAL_STREAM]).generate_state(1)[0] % 2**31)


EVAL_STREAM = 1  # SeedSequence key of the evaluation stream


def atari_settings(env: DictConfig) -> AtariSettings:
    """The ``env`` section's ALE settings (used only when ``env.name`` is an ALE game)."""
    return AtariSettings.from_config({"name": env.name, **env.atari})


def _options(env: DictConfig) -> dict:
    """What ``make_env`` takes from the config besides the name: the kind decided when composing, the pixel keys."""
    return {"kind": env.kind, "from_pixels": env.from_pixels, "image_size": env.image_size}


def make_train_env(cfg: DictConfig, obs_norm_state: dict | None = None, seed: int | None = None,
                   num_envs: int | None = None):
    """The training env: ``num_envs`` (default ``cfg.env.num_envs``) copies stepped together (by a batched
    simulator, ``env.backend``, or as Gymnasium copies in this process or one process each, ``env.vector``), seeded
    with ``seed`` (default ``cfg.seed``; a resumed run passes a new one); with ``env.obs_norm`` observations are
    standardised with statistics from ``obs_norm_state`` (a resumed run's) or from ``env.obs_norm_init_steps``
    random-action steps of each copy."""
    from torchrl.envs import (Compose, DoubleToFloat, InitTracker, ParallelEnv, RewardSum, SerialEnv, StepCounter,
                              TransformedEnv)

    from shared.env_backends import make_batched_env

    n = cfg.env.num_envs if num_envs is None else num_envs
    seed = cfg.seed if seed is None else seed
    if cfg.env.backend != "gymnasium":  # one batched simulator steps all n copies
        base = TransformedEnv(make_batched_env(cfg.env.backend, cfg.env.name, n, seed),
                              Compose(DoubleToFloat(), RewardSum()))  # as make_env does for Gymnasium ids
    elif cfg.env.kind == "atari" or n == 1:  # AtariVectorEnv batches its games itself
        base = make_env(cfg.env.name, seed=seed, num_envs=n, atari=atari_settings(cfg.env), train=True,
                        **_options(cfg.env))
    elif cfg.env.vector == "process":  # torchrl's env workers tell only that one exited: each guard writes its fault
        report = Path(tempfile.mkdtemp(prefix="rlstack-env-faults-"))
        base = ParallelEnv(n, partial(make_env, cfg.env.name, seed=seed, train=True, fault_report=report,
                                      **_options(cfg.env)))
        base.env_fault_report = report  # read by reported_env_fault; removed with the env
        weakref.finalize(base, shutil.rmtree, report, True)
        base.set_seed(seed)  # copy i gets seed + i
    else:
        base = SerialEnv(n, partial(make_env, cfg.env.name, seed=seed, train=True, **_options(cfg.env)))
        base.set_seed(seed)
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


def reported_env_fault(env) -> EnvFault | None:
    """The fault an env worker of the training env ``env`` reported (``env.vector=process``: the worker's exception
    stays in its process), None: none; a collector that fails asks this before it re-raises."""
    from torchrl.envs import TransformedEnv

    base = env.base_env if isinstance(env, TransformedEnv) else env
    report = base.__dict__.get("env_fault_report")
    return reported_fault(report) if report is not None else None


def obs_norm_state(env) -> dict | None:
    """The ObservationNorm statistics of a training env (None without ``env.obs_norm``), for checkpoints and the
    evaluation env."""
    from torchrl.envs import ObservationNorm

    norms = [t for t in env.transform if isinstance(t, ObservationNorm)]
    return {k: v.clone() for k, v in norms[0].state_dict().items()} if norms else None


def make_eval_env(cfg: DictConfig, *, render: bool = False, obs_norm: dict | None = None):
    """The evaluation env: one copy, seeded apart from training; Atari plays whole games with raw scores.
    ``obs_norm`` (from :func:`obs_norm_state`) standardises observations as in training."""
    env = make_env(cfg.env.name, seed=eval_seed(cfg.seed), num_envs=1, render=render, atari=atari_settings(cfg.env),
                   train=False, **_options(cfg.env))
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
