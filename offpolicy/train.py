"""Entry point of the off-policy engine: ``python -m offpolicy.train algo=NAME [env=...] [key=value...]`` (the
algorithms: offpolicy/algos/), or from Python ``from offpolicy import train; summary = train(algo=NAME, ...)``
(:func:`from_python`).

Assembles a run and runs it: the parts come from the builder (offpolicy/builder.py), the engine decides where they
run (offpolicy/engines/), the run's services and stops are offpolicy/run.py, the loop offpolicy/loop.py.
"""
from __future__ import annotations

import json
import sys

import torch
from omegaconf import DictConfig, OmegaConf

from offpolicy.algos import ALGOS
from offpolicy.builder import Builder
from offpolicy.checkpoint import Checkpoint
from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, compose_config
from offpolicy.engines import engine_class, make_engine
from offpolicy.envs import eval_max_steps, obs_norm_state
from offpolicy.evaluate import AsyncEvaluator
from offpolicy.loop import train_loop
from offpolicy.metrics import SharedLogger
from offpolicy.run import Progress, Run, start_line
from shared.checkpoint import resumed_seed
from shared.config import help_text, make_run_dir, overrides_argv, python_entry_point, run_cli
from shared.logging import make_logger
from shared.plots import plot_curves

USAGE = (f"usage: python -m offpolicy.train algo={'|'.join(ALGOS)} [env=NAME] [profile=smoke|local|ray_smoke|...] "
         "[engine=local|ray] [run_dir=PATH] [resume=CHECKPOINT] [key=value ...]")
EXIT_INVARIANT = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130


def train(cfg: DictConfig, checkpoint: Checkpoint | None = None) -> dict:
    """Run one training job described by ``cfg`` (resumed from ``checkpoint``); returns the summary (also written to
    ``summary.json``)."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    progress = Progress.from_state(checkpoint.counters if checkpoint is not None else None)
    seed = resumed_seed(cfg.seed, progress.env_steps)  # a resumed run plays new episodes, not the first run's again
    builder = Builder(cfg)
    env = builder.train_env(checkpoint.obs_norm if checkpoint is not None else None, seed=seed,
                            num_envs=engine_class(cfg.engine).training_env_copies(cfg))
    parts = builder.parts(env)  # (checks the env's actions suit the algorithm before anything is written)
    run_dir = make_run_dir(cfg, f"offpolicy-{cfg.algo}-{cfg.env.name.replace('/', '_')}")
    norm = obs_norm_state(env)
    engine = make_engine(builder, env, parts, run_dir, seed)  # the one place where local or Ray is chosen
    try:
        if checkpoint is not None:
            checkpoint.restore(engine, parts.exploration, storage=cfg.replay.storage, version=progress.batches)
        print(start_line(cfg, engine, run_dir, progress, resumed=checkpoint is not None), flush=True)
        logger = SharedLogger(make_logger(cfg.logger.backend, run_dir,
                                          config=OmegaConf.to_container(cfg, resolve=True)))
        evaluator = AsyncEvaluator(lambda render: builder.eval_env(render=render, obs_norm=norm), parts.eval_policy,
                                   logger, episodes=cfg.eval.episodes, max_steps=eval_max_steps(cfg),
                                   video_dir=run_dir / "videos" if cfg.eval.video else None)
        run = Run(cfg, run_dir, engine, parts, env.action_spec_unbatched, progress, logger, evaluator, norm)
        status, error = run.until_stopped(train_loop)
    finally:
        engine.close()
    status, error = run.final_evaluation(status, error)
    logger.close()
    summary = run.summary(status, error)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_curves(run_dir, {"train": "train/return", "eval": "eval/return"},
                title=f"{cfg.algo.upper()} on {cfg.env.name}", xlabel="collected env steps")
    return summary


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
    or the background collector fails, 130 on Ctrl-C."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(CONFIG_DIR, USAGE, ALIASES, GROUPS))
        return 0
    cfg, checkpoint = compose_config(argv)
    summary = train(cfg, checkpoint)
    print(json.dumps(summary))
    if summary["status"] == "invariant_broken":
        print(f"error: invariant broken: {summary['error']}; checkpoint saved to {summary['checkpoint']}",
              file=sys.stderr)
        return EXIT_INVARIANT
    if summary["status"] == "failed":
        print(f"error: {summary['error']}; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_FAILED
    if summary["status"] == "interrupted":
        print(f"interrupted; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


python_entry_point(__name__)

if __name__ == "__main__":
    run_cli(main)
