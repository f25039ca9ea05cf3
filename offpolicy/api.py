"""The off-policy engine from Python: ``from offpolicy.api import train; summary = train(algo=NAME, ...)`` runs what
``python -m offpolicy.train algo=NAME ...`` runs, in the calling process, for notebooks and sweeps.

Why a module of its own: ``offpolicy.train`` is the module that ``python -m`` runs, and importing it binds the package's
attribute ``train`` to that module, so a function ``offpolicy.train`` would be replaced whenever the module is
imported (by the CLI's own imports, a test, another module)."""
from __future__ import annotations

from offpolicy import train as entry_point
from shared.config import overrides_argv


def train(**overrides) -> dict:
    """A run from Python: ``train(algo=NAME, env=ENV_ID, **overrides)``. The keyword arguments are the command line's
    keys and aliases (a dict sets the keys under its key, ``optim={"lr": 1e-3}``; or ``**{"optim.lr": 1e-3}``),
    checked as on the command line: a bad key or value raises ConfigError with the CLI's ``error:`` line as its
    message. Returns the summary (also written to ``summary.json``); its ``status`` says how the run ended (completed,
    interrupted, failed, invariant_broken), where the CLI exits with a code."""
    cfg, checkpoint = entry_point.compose_config(overrides_argv(overrides))
    return entry_point.train(cfg, checkpoint)
