"""The A3C model: the actor-critic (shared/models.py) that a run's config describes, built fresh or with the weights
of an ``a3c.train`` checkpoint."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from shared.atari import AtariSettings
from shared.checkpoint import load_checkpoint
from shared.models import AtariActorCritic

FORMAT_VERSION = 1  # of an a3c.train checkpoint; a file without one is version 0, the same layout (no migration)


def build_model(cfg, num_actions: int) -> AtariActorCritic:
    """The actor-critic described by a run config."""
    settings = AtariSettings.from_config(cfg.env)
    return AtariActorCritic(num_actions, settings.channels, settings.image_size, cfg.model.arch,
                            recurrent=cfg.model.recurrent, lstm_size=cfg.model.lstm_size)


def read_checkpoint(path: str | Path) -> dict:
    """A checkpoint of ``a3c.train`` given as ``checkpoint=path``; anything wrong with the file is one ConfigError
    naming ``checkpoint``."""
    return load_checkpoint(path, key="checkpoint", required=("model", "config", "num_actions", "counters"),
                           written_by="a3c.train", format_version=FORMAT_VERSION)


def checkpoint_model(ckpt: dict) -> tuple[DictConfig, AtariActorCritic]:
    """A checkpoint's config, and its model with the saved weights."""
    cfg = OmegaConf.create(ckpt["config"])
    model = build_model(cfg, ckpt["num_actions"])
    model.load_state_dict(ckpt["model"])
    return cfg, model
