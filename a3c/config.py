"""The A3C config: defaults in configs/a3c/config.yaml, profiles in configs/a3c/profile/, and the allowed values."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from shared.config import (CONFIG_ROOT, ConfigError, Group, Rule, check_kept_on_resume, compose, help_text,
                           parse_overrides)
from shared.atari import check_atari_name
from shared.logging import BACKENDS, check_logger_backend
from shared.models import AtariActorCritic, AtariTrunk

CONFIG_DIR = CONFIG_ROOT / "a3c"
ALIASES = {"env": "env.name", "lr": "optim.lr", "arch": "model.arch"}
GROUPS = (Group("profile"),)
USAGE = "usage: python -m a3c.train [env=Pong] [workers=N] [profile=smoke] [key=value ...]"


def check_env_name(name) -> None:
    """A3C's env is an ALE game: its workers step ale_py's AtariVectorEnv directly (shared/atari.py), with no
    Gymnasium env in between, so an own env (``module:EnvId``) or a dm_control task is one clear ConfigError."""
    if ":" in str(name):
        raise ConfigError(f"env.name={name!r} is not allowed: A3C takes ALE games only (its workers step ale_py's "
                          "AtariVectorEnv); allowed: a short name such as Pong or a full id such as ALE/Pong-v5 (envs "
                          "of your own package, module:EnvId, and dm_control tasks run in the off-policy engine)")
    check_atari_name(name)


_positive_int = Rule(min=1, integer=True)
_non_negative = Rule(min=0)
RULES = {
    "env.name": Rule(check=check_env_name),
    "env.envs_per_worker": _positive_int,
    "env.frame_skip": _positive_int,
    "env.frame_stack": _positive_int,
    "env.image_size": Rule(min=36, max=256, integer=True),
    "env.noop_max": Rule(min=0, integer=True),
    "env.sticky_actions": Rule(min=0.0, max=1.0),
    "env.max_episode_frames": _positive_int,
    "model.arch": Rule(choices=AtariTrunk.ARCHS),
    "model.recurrent": Rule(choices=(None, *AtariActorCritic.RECURRENT)),
    "model.lstm_size": Rule(min=1, max=4096, integer=True),
    "workers": Rule(min=1, max=256, integer=True),
    "total_frames": _positive_int,
    "seed": Rule(min=0, integer=True),
    "a3c.t_max": _positive_int,
    "a3c.gamma": Rule(min=0.0, max=1.0),
    "a3c.gae_lambda": Rule(min=0.0, max=1.0),
    "a3c.entropy_coeff": _non_negative,
    "a3c.critic_coeff": _non_negative,
    "a3c.loss_critic_type": Rule(choices=("l2", "smooth_l1")),
    "a3c.max_grad_norm": Rule(min=1e-8),
    "a3c.minibatches": _positive_int,
    "optim.name": Rule(choices=("adam", "rmsprop")),
    "optim.lr": Rule(min=1e-12, max=1.0),
    "optim.eps": Rule(min=0.0),
    "optim.rmsprop_alpha": Rule(min=0.0, max=1.0),
    "optim.rmsprop_initial_square_avg": _non_negative,
    "optim.weight_decay": _non_negative,
    "eval.interval_frames": Rule(min=0, integer=True),
    "eval.episodes": _positive_int,
    "eval.final_episodes": Rule(min=0, integer=True),
    "eval.max_episode_frames": _positive_int,
    "logger.backend": Rule(choices=BACKENDS),
    "logger.interval_s": _non_negative,
    "checkpoint.interval_s": _non_negative,
    "supervision.max_restarts": Rule(min=0, integer=True),
    "supervision.stop_timeout_s": Rule(min=0.5, max=60),
}


# what the checkpoint's model (its input channels and actions) and optimiser state were built for
RESUME_KEYS = ("env.name", "env.frame_stack", "env.image_size", "env.grayscale", "model.arch", "model.recurrent",
               "model.lstm_size", "optim.name")


def load_config(argv: list[str], base: dict | None = None) -> DictConfig:
    """Compose the A3C config from the command line's ``key=value`` words (``base``: a resumed checkpoint's
    config)."""
    return compose_config(parse_overrides(argv, ALIASES), base)


def compose_config(overrides: dict[str, str], base: dict | None = None) -> DictConfig:
    """Compose the A3C config from overrides already parsed by :func:`~shared.config.parse_overrides` (``base``: a
    resumed checkpoint's config)."""
    cfg = compose(CONFIG_DIR, overrides, groups=GROUPS, rules=RULES, base=base)
    check_logger_backend(cfg.logger.backend)
    if base is not None:
        check_kept_on_resume(cfg, OmegaConf.create(base), RESUME_KEYS,
                             "the checkpoint's model and optimiser state were built for it")
    if cfg.model.recurrent and cfg.a3c.minibatches != 1:
        raise ConfigError(f"a3c.minibatches={cfg.a3c.minibatches} is not allowed with model.recurrent="
                          f"{cfg.model.recurrent}; allowed: 1 (the LSTM is unrolled over the whole rollout)")
    rollout = cfg.env.envs_per_worker * cfg.a3c.t_max
    if rollout % cfg.a3c.minibatches:
        raise ConfigError(f"a3c.minibatches={cfg.a3c.minibatches} must divide the rollout size "
                          f"env.envs_per_worker x a3c.t_max = {rollout}")
    return cfg


def config_help() -> str:
    return help_text(CONFIG_DIR, USAGE, ALIASES, GROUPS)
