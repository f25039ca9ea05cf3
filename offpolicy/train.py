"""Entry point of the off-policy engine: ``python -m offpolicy.train algo=NAME [env=...] [key=value...]`` (the
algorithms: offpolicy/algos/), or from Python ``from offpolicy import train; summary = train(algo=NAME, ...)``
(:func:`from_python`).

A run (offpolicy/run.py) builds its parts through the builder (offpolicy/builder.py) in the engine that decides where
they run (offpolicy/engines/), owns the services around the loop (offpolicy/loop.py) and writes the summary.
"""
from __future__ import annotations

import json
import sys

import torch
from omegaconf import DictConfig

from offpolicy.algos import ALGOS
from offpolicy.checkpoint import Checkpoint
from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, compose_config
from offpolicy.engines import learner_threads
from offpolicy.loop import train_loop
from offpolicy.run import Run
from shared import denormals
from shared.config import help_text, overrides_argv, python_entry_point, run_cli

USAGE = (f"usage: python -m offpolicy.train algo={'|'.join(ALGOS)} [env=NAME] [profile=smoke|local|ray_smoke|...] "
         "[engine=local|ray] [run_dir=PATH] [resume=CHECKPOINT] [key=value ...]")
EXIT_INVARIANT = 3
EXIT_FAILED = 4
EXIT_ENV_FAULT = 5
EXIT_INTERRUPTED = 130


def train(cfg: DictConfig, checkpoint: Checkpoint | None = None) -> dict:
    """Run one training job described by ``cfg`` (resumed from ``checkpoint``); returns the summary (also written to
    ``summary.json``)."""
    torch.manual_seed(cfg.seed)
    denormals.start_intra_op_threads(learner_threads(cfg))  # before the run's first parallel op: they inherit FTZ
    return Run(cfg, checkpoint).train(train_loop)


def from_python(**overrides) -> dict:
    """``offpolicy.train(algo=NAME, env=ENV_ID, **overrides)``: a run from Python. The keyword arguments are
    the command line's keys and aliases (a dict sets the keys under its key, ``optim={"lr": 1e-3}``; or
    ``**{"optim.lr": 1e-3}``), checked as on the command line: a bad key or value raises ConfigError with the CLI's
    ``error:`` line as its message. Returns the summary (also written to ``summary.json``); its ``status`` says how
    the run ended (completed, interrupted, failed, invariant_broken), where the CLI exits with a code."""
    cfg, checkpoint = compose_config(overrides_argv(overrides))
    return train(cfg, checkpoint)


def main(argv: list[str]) -> int:
    """CLI: compose the config, train, print where the results are; exit 3 on a broken invariant, 4 when a Ray actor
    or the background collector fails, 5 when the env fails (raises, or returns a non-finite value), 130 on
    Ctrl-C."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(CONFIG_DIR, USAGE, ALIASES, GROUPS))
        return 0
    cfg, checkpoint = compose_config(argv)
    summary = train(cfg, checkpoint)
    print(json.dumps(summary))
    if summary["status"] == "invariant_broken":
        print(f"error: invariant broken: {summary['error']}; the state at the break: {summary['broken_state']} (for "
              f"inspection, not resumable); latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_INVARIANT
    if summary["status"] == "failed":
        print(f"error: {summary['error']}; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_ENV_FAULT if summary["env_fault"] else EXIT_FAILED
    if summary["status"] == "interrupted":
        print(f"interrupted; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


python_entry_point(__name__)

if __name__ == "__main__":
    run_cli(main)
