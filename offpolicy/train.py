"""Entry point of the off-policy engine: ``python -m offpolicy.train algo=NAME [env=...] [key=value...]`` (the
algorithms: offpolicy/algos/); from Python ``from offpolicy.api import train; summary = train(algo=NAME, ...)``
(offpolicy/api.py).

A run (offpolicy/run.py) builds its parts through the builder (offpolicy/builder.py) in the engine that decides where
they run (offpolicy/engines/), owns the services around the loop (offpolicy/loop.py) and writes the summary.
"""
from __future__ import annotations

import json
import sys

import torch
from omegaconf import DictConfig

from offpolicy import prepare_process
from offpolicy.algos import ALGOS
from offpolicy.checkpoint import Checkpoint
from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, compose_config, reference
from offpolicy.loop import train_loop
from offpolicy.run import Run
from shared.config import help_text, run_cli

USAGE = (f"usage: python -m offpolicy.train algo={'|'.join(ALGOS)} [env=NAME] [profile=smoke|local|ray_smoke|...] "
         "[engine=local|ray] [run_dir=PATH] [resume=CHECKPOINT] [key=value ...]")
EXIT_INVARIANT = 3
EXIT_FAILED = 4
EXIT_ENV_FAULT = 5
EXIT_INTERRUPTED = 130


def train(cfg: DictConfig, checkpoint: Checkpoint | None = None) -> dict:
    """Run one training job described by ``cfg`` (resumed from ``checkpoint``); returns the summary (also written to
    ``summary.json``)."""
    prepare_process()
    torch.manual_seed(cfg.seed)
    return Run(cfg, checkpoint).train(train_loop)


def main(argv: list[str]) -> int:
    """CLI: compose the config, train, print where the results are; exit 3 on a broken invariant, 4 when a Ray actor
    or the background collector fails, 5 when the env fails (raises, or returns a non-finite value), 130 on
    Ctrl-C."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(reference(), USAGE, ALIASES, GROUPS, CONFIG_DIR))
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


if __name__ == "__main__":
    run_cli(main)
