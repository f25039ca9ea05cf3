"""Where the loop's parts run: ``engine=local`` (this process) or ``engine=ray`` (collector actors, a replay actor and
learner ranks). :func:`engine_class` is the one place an engine is found by its name; its module is imported only
then, so a local run never imports Ray's."""
from __future__ import annotations

import importlib

from offpolicy.engines.base import Engine

ENGINES = {"local": "offpolicy.engines.local:LocalEngine", "ray": "offpolicy.engines.ray:RayEngine"}


def engine_class(name: str) -> type[Engine]:
    """The engine called ``name`` (a name the config rule has accepted)."""
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)

