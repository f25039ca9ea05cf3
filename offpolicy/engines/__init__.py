"""Where the loop's parts run: ``engine=local`` (this process) or ``engine=ray`` (collector actors, a replay actor and
learner ranks). :func:`make_engine` is the one place where the choice is made."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from offpolicy.engines.base import Engine


def make_engine(cfg: DictConfig, env, parts, run_dir: Path, seed: int) -> Engine:
    """The engine ``cfg.engine`` names, built around ``parts`` (offpolicy/algos/) and the training env (the
    local collector's env, already seeded with ``seed``; the local lean collector and the Ray collectors build their
    own from the config, seeded from ``seed``, and then only read ``env``'s specs and statistics)."""
    if cfg.engine == "ray":
        from offpolicy.engines.ray import RayEngine

        return RayEngine(cfg, env, parts, seed)
    from offpolicy.engines.local import LocalEngine

    return LocalEngine(cfg, env, parts, run_dir, seed)


def training_env_copies(cfg: DictConfig) -> int:
    """Env copies the training process builds as torchrl envs: all ``env.num_envs`` when torchrl's local Collector
    steps them; one when only its specs and observation statistics are read: the Ray driver (the collector actors
    build their own copies) and the local lean collector (it steps Gymnasium copies of its own)."""
    from offpolicy.collection import lean_collection

    return 1 if cfg.engine == "ray" or lean_collection(cfg) else cfg.env.num_envs


def describe_failure(exc: BaseException) -> str | None:
    """One line for a failure an engine reports (a Ray actor died or timed out); None when ``exc`` is not one."""
    try:
        from offpolicy.engines.ray import describe_ray_failure
    except ImportError:  # Ray is not installed: no Ray failure is possible
        return None
    return describe_ray_failure(exc)
