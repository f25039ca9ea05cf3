"""A3C on Atari: ``python -m a3c.train env=Pong workers=N [profile=smoke] [key=value ...]``, or from Python
``from a3c.api import train; summary = train(env="Pong", workers=2)`` (a3c/api.py).

The global actor-critic and its optimizer state live in shared memory; N worker processes each play, compute
gradients on a local copy, copy them into the global model and step the shared optimizer (a3c/worker.py). This
process supervises them, shows progress, checkpoints on a timer and on exit, and writes curves.png and summary.json.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from a3c.child_process import child_context
from a3c.config import ALIASES, compose_config, config_help
from a3c.model import FORMAT_VERSION, build_model
from a3c.optim import make_shared_optimizer
from a3c.stats import SharedStats
from a3c.supervisor import WorkerFailure, WorkerPool
from shared.checkpoint import load_checkpoint, resumed_config, resumed_seed, save_checkpoint
from shared.config import make_run_dir, parse_overrides, run_cli
from shared.atari import atari_rom, minimal_action_set
from shared.plots import plot_curves
from shared.processes import check_main_guard

EXIT_CODES = {"completed": 0, "failed": 1, "interrupted": 130}


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the supervision loop polls."""

    def __init__(self):
        self.signum: int | None = None
        self.previous = {signum: signal.signal(signum, self._handle) for signum in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, _frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        """Give the signals back to their previous handlers (a run from Python returns to its caller's Ctrl-C)."""
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def save(path: Path, model, optimizer, stats: SharedStats, cfg, num_actions: int) -> None:
    counts = stats.snapshot()
    save_checkpoint(path, {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "counters": {"frames": counts["frames"], "updates": counts["updates"], "episodes": counts["episodes"]},
        "config": OmegaConf.to_container(cfg, resolve=True),
        "num_actions": num_actions,
    })


CHECKPOINT_KEYS = ("model", "optimizer", "counters", "config", "num_actions")  # what save() writes


def compose_run(argv: list[str]) -> tuple[DictConfig, dict | None]:
    """The run's config from ``key=value`` words and, with ``resume=PATH``, the checkpoint it continues (its config
    is the base)."""
    overrides = parse_overrides(argv, ALIASES)  # once: both the checkpoint to resume and the config come from it
    resume = overrides.get("resume")
    ckpt = load_checkpoint(resume, key="resume", required=CHECKPOINT_KEYS, written_by="a3c.train",
                           format_version=FORMAT_VERSION) if resume else None
    return compose_config(overrides, base=resumed_config(ckpt["config"], resume) if ckpt else None), ckpt


def train(cfg: DictConfig, ckpt: dict | None = None) -> dict:
    """Run the job ``cfg`` describes (continuing checkpoint ``ckpt``); returns the summary (also written to
    ``summary.json``)."""
    check_main_guard("a3c.train")  # before the run dir or any worker: each child imports ``__main__`` again
    run_dir = make_run_dir(cfg, f"a3c-{cfg.env.name}")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the fork server before it imports torch, and its children
    torch.set_num_threads(1)

    # The number of actions is the size of ALE's minimal action set of the game, the set the workers' AtariVectorEnv
    # plays: this process builds no env it could ask (the workers and the evaluator build theirs), and ALE reads the
    # set from the loaded ROM, without a throw-away vector env's threads, frame buffers and game resets.
    num_actions = len(minimal_action_set(atari_rom(cfg.env.name)))
    model = build_model(cfg, num_actions).share_memory()
    optimizer = make_shared_optimizer(model.parameters(), cfg.optim)
    stats = SharedStats(cfg.workers)
    if ckpt:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])  # SharedAdam/SharedRMSprop re-share the loaded state
        stats.restore(**ckpt["counters"])
    ckpt_path = run_dir / "checkpoints" / "last.pt"
    print(f"a3c: {cfg.env.name}, {cfg.workers} workers x {cfg.env.envs_per_worker} envs, {cfg.model.arch} model, "
          f"{stats.frames:,}/{cfg.total_frames:,} frames; run dir {run_dir}", flush=True)

    # a resumed run's workers (and their evaluations) play new games, not the first run's again
    workers_cfg = {**OmegaConf.to_container(cfg, resolve=True), "seed": resumed_seed(cfg.seed, stats.frames)}
    pool = WorkerPool(child_context(), workers_cfg, model, optimizer, num_actions, stats)
    stop = StopRequest()
    start_time, start_frames = time.monotonic(), stats.frames
    last_ckpt = start_time
    status, error = "completed", None
    pool.start()
    (run_dir / "pids.json").write_text(json.dumps({"main": os.getpid(), **pool.pids()}))
    bar = tqdm(total=cfg.total_frames, initial=start_frames, unit="frame", unit_scale=True, dynamic_ncols=True,
               file=sys.stdout, mininterval=1.0)
    try:
        while True:
            time.sleep(0.25)
            if stop.signum is not None:
                status = "interrupted"
                break
            if pool.check():
                break
            frames = stats.frames
            bar.update(min(frames, cfg.total_frames) - bar.n)
            recent = stats.recent_scores(20)
            final = stats.final_evaluation()
            bar.set_postfix(fps=f"{(frames - start_frames) / (time.monotonic() - start_time):.0f}",
                            ret=f"{sum(recent) / len(recent):.1f}" if recent else "-",
                            eval="-" if final is None else f"{final['return']:.1f}", refresh=False)
            if cfg.checkpoint.interval_s and time.monotonic() - last_ckpt >= cfg.checkpoint.interval_s:
                save(ckpt_path, model, optimizer, stats, cfg, num_actions)
                last_ckpt = time.monotonic()
    except WorkerFailure as exc:
        status, error = "failed", str(exc)
    finally:
        pool.stop(cfg.supervision.stop_timeout_s)
        stop.restore()
        bar.close()
    save(ckpt_path, model, optimizer, stats, cfg, num_actions)
    elapsed = time.monotonic() - start_time
    counts = stats.snapshot()
    curves = plot_curves(run_dir, {"train return (all workers)": "train/return", "greedy eval return": "eval/return",
                                   "final greedy eval": "eval/final_return"},
                         title=f"A3C {cfg.env.name}: {cfg.workers} workers", xlabel="emulator frames")
    all_evals, _ = stats.evals_since(0)  # this session's (the ring holds the latest 1,024)
    last_evals = all_evals[-1:]
    recent = stats.recent_scores(100)
    summary = {
        "status": status, "error": error, "env": cfg.env.name, "workers": cfg.workers, **counts,
        "wall_time_s": elapsed,
        "frames_per_s": (counts["frames"] - start_frames) / elapsed,
        "agent_steps_per_s": (counts["frames"] - start_frames) / cfg.env.frame_skip / elapsed,
        "train_return_last_100": sum(recent) / len(recent) if recent else None,
        "last_eval": dict(zip(("frames", "return", "return_std", "episodes", "result_frames"), last_evals[-1]))
        if last_evals else None,
        # every periodic evaluation of this session, as the shared statistics hold it (worker 0's log has only those
        # that came before it finished)
        "evaluations": [dict(zip(("frames", "return", "return_std", "episodes", "result_frames"), e))
                        for e in all_evals],
        "eval_max_lag_frames": max((e[4] - e[0] for e in all_evals), default=None),
        "eval_wait_s": stats.eval_wait_s(), "evaluator_restarts": pool.evaluator_restarts,
        "final_eval": stats.final_evaluation(),
        "worker_updates": stats.updates_per_worker(),
        "worker_restarts": pool.restarts, "worker_deaths": pool.deaths, "pids": pool.pids(),
        "checkpoint": str(ckpt_path), "curves": str(curves) if curves else None,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"a3c: {status} at {counts['frames']:,} frames in {elapsed:.0f}s "
          f"({summary['agent_steps_per_s']:.0f} agent steps/s); checkpoint {ckpt_path}", flush=True)
    return summary


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(config_help())
        return 0
    summary = train(*compose_run(argv))
    if summary["error"]:
        print(f"error: {summary['error']}", file=sys.stderr)
    return EXIT_CODES[summary["status"]]


if __name__ == "__main__":
    run_cli(main)
