"""Where the loop's parts run: ``engine=local`` (this process) or ``engine=ray`` (collector actors, a replay actor and
learner ranks). :func:`engine_class` is the one place an engine is found by its name; its module is imported only
then, so a local run never imports Ray's."""
from __future__ import annotations

import importlib
from pathlib import Path

from offpolicy.engines.base import Engine

ENGINES = {"local": "offpolicy.engines.local:LocalEngine", "ray": "offpolicy.engines.ray:RayEngine"}


def engine_class(name: str) -> type[Engine]:
    """The engine called ``name`` (a name the config rule has accepted)."""
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_engine(builder, env, parts, run_dir: Path, seed: int) -> Engine:
    """The engine the builder's config names, built around ``parts`` (offpolicy/algos/) and the training env (the
    local collector's env, already seeded with ``seed``; the local lean collector and the Ray collectors build their
    own from the config, seeded from ``seed``, and then only read ``env``'s specs and statistics)."""
    return engine_class(builder.cfg.engine)(builder, env, parts, run_dir, seed)
