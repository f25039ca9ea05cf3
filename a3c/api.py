"""A3C from Python: ``from a3c.api import train; summary = train(env="Pong", workers=2)`` runs what
``python -m a3c.train env=Pong workers=2`` runs, from the calling process (which starts the workers).

Why a module of its own: ``a3c.train`` is the module that ``python -m`` runs, and importing it binds the package's
attribute ``train`` to that module, so a function ``a3c.train`` would be replaced whenever the module is imported."""
from __future__ import annotations

from a3c import train as entry_point
from shared.config import overrides_argv


def train(**overrides) -> dict:
    """A run from Python: ``train(env="Pong", workers=2, **overrides)``. The keyword arguments are the command line's
    keys and aliases (a dict sets the keys under its key, ``a3c={"t_max": 5}``), checked as on the command line: a bad
    key or value raises ConfigError with the CLI's ``error:`` line as its message. Returns the summary (also written
    to ``summary.json``); its ``status`` says how the run ended, where the CLI exits with a code."""
    return entry_point.train(*entry_point.compose_run(overrides_argv(overrides)))
