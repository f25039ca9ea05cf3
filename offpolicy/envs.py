"""The off-policy engine's envs: the training env (batched, seeded, with step counts, init flags and optional
observation normalisation) and the evaluation env, built on shared/envs.py."""
from __future__ import annotations

from functools import partial

from omegaconf import DictConfig

from shared.envs import AtariSettings, atari_rom, make_env


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
