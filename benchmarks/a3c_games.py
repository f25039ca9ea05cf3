"""A3C on Atari games at the default config, each for a fixed wall-clock budget, alone on the machine (a figure, not a
test). Per game: ``python -m a3c.train env=GAME workers=2 seed=SEED``, stopped with Ctrl-C after ``minutes`` (it
saves its checkpoint), then ``python -m a3c.evaluate`` of that checkpoint over ``episodes`` greedy whole games. Prints
one JSON line per game, with RL Baselines3 Zoo's A2C score at 10M agent steps (40M frames) beside it.

    python benchmarks/a3c_games.py [games=Breakout,SpaceInvaders,Seaquest] [minutes=40] [seed=0] [episodes=10]
                                   [out=runs/games] [stop_at=SCORE] [section.key=value ...]
    python benchmarks/a3c_games.py report=RUN_DIR[,RUN_DIR...] [stop_at=SCORE]  # the lines of runs already made

``stop_at`` (Pong's time to 18: ``games=Pong stop_at=18``) ends a run at its first periodic greedy evaluation at or
above that score, and the lines then say when that was (``first_eval_at_target_*``). Dotted keys
(``env.envs_per_worker=16 a3c.t_max=5``) go to ``a3c.train`` as they are, and the lines name them (``overrides``).

Run it alone: a test suite or benchmark beside it takes cores from the workers and changes every wall-clock figure.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.logging import read_scalars  # noqa: E402

# DLR-RM/rl-baselines3-zoo, benchmark.md ("Performance of trained agents"): A2C on <Game>NoFrameskip-v4 after 10M
# steps, mean and std of the episode score over its evaluation (one training run each, stochastic policy on Atari)
RL_ZOO_A2C = {"Pong": (17.292, 3.214), "Breakout": (279.793, 122.177), "SpaceInvaders": (627.160, 201.974),
              "Seaquest": (1721.493, 105.339)}


def report(run_dir: Path, target: float | None = None) -> dict:
    """One game's figures: frames and minutes trained, the final greedy score, the periodic evaluations' best, and
    the first periodic evaluation at or above the RL Zoo A2C score and at or above ``target`` (frames of its weights,
    minutes at those frames)."""
    import numpy as np
    import yaml

    summary = json.loads((run_dir / "summary.json").read_text())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    game = summary["env"]
    frames, returns = read_scalars(run_dir, "eval/return")
    clock_frames, elapsed = read_scalars(run_dir, "time/elapsed_s")
    minutes = [float(m) / 60 for m in np.interp(frames, clock_frames, elapsed)] if clock_frames else []
    evaluation = run_dir / "evaluation.json"
    final = json.loads(evaluation.read_text()) if evaluation.exists() else summary.get("final_eval")
    anchor = RL_ZOO_A2C.get(game)
    reached = first_at(frames, minutes, returns, anchor[0] if anchor else None)
    at_target = first_at(frames, minutes, returns, target)
    best = int(np.argmax(returns)) if returns else None
    return {
        "bench": "a3c_games", "game": game, "seed": config["seed"], "recurrent": config["model"].get("recurrent"),
        "envs_per_worker": config["env"]["envs_per_worker"], "t_max": config["a3c"]["t_max"],
        "frames": summary["frames"], "minutes": round(summary["wall_time_s"] / 60, 1),
        "agent_steps_per_s": round(summary["agent_steps_per_s"]),
        "greedy_return": None if final is None else round(final["return"], 1),
        "greedy_return_std": None if final is None else round(final["return_std"], 1),
        "greedy_games": None if final is None else int(final["episodes"]),
        "train_return_last_100": summary["train_return_last_100"],
        "best_periodic_eval": None if best is None else round(returns[best], 1),
        "best_periodic_eval_frames": None if best is None else int(frames[best]),
        "rl_zoo_a2c_10M_steps": None if anchor is None else anchor[0],
        "rl_zoo_a2c_std": None if anchor is None else anchor[1],
        "first_eval_at_rl_zoo_frames": None if reached is None else int(reached[0]),
        "first_eval_at_rl_zoo_minutes": None if reached is None else round(reached[1], 1),
        **({} if target is None else {
            "target": target, "first_eval_at_target_frames": None if at_target is None else int(at_target[0]),
            "first_eval_at_target_minutes": None if at_target is None else round(at_target[1], 1)}),
    }


def first_at(frames, minutes, returns, score: float | None) -> tuple[float, float] | None:
    """``(frames, minutes)`` of the first periodic evaluation at or above ``score`` (None: never, or no score)."""
    return next(((f, m) for f, m, r in zip(frames, minutes, returns) if score is not None and r >= score), None)


def train_and_evaluate(game: str, minutes: float, seed: int, episodes: int, run_dir: Path,
                       stop_at: float | None = None, overrides: tuple[str, ...] = ()) -> None:
    """Train for ``minutes`` (or until a periodic evaluation reaches ``stop_at``), then evaluate the checkpoint."""
    train = subprocess.Popen([sys.executable, "-m", "a3c.train", f"env={game}", "workers=2", f"seed={seed}",
                              f"run_dir={run_dir}", *overrides], cwd=ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + minutes * 60
    while train.poll() is None and time.monotonic() < deadline:
        time.sleep(5)
        if stop_at is not None and any(r >= stop_at for r in read_scalars(run_dir, "eval/return")[1]):
            break
    if train.poll() is None:
        train.send_signal(signal.SIGINT)  # Ctrl-C: the run stops cleanly and saves its checkpoint
        train.wait()
    subprocess.run([sys.executable, "-m", "a3c.evaluate", f"checkpoint={run_dir}/checkpoints/last.pt",
                    f"episodes={episodes}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> None:
    overrides = tuple(a for a in argv if "." in a.split("=", 1)[0])
    options = dict(a.split("=", 1) for a in argv if "=" in a and a not in overrides)
    stop_at = float(options["stop_at"]) if "stop_at" in options else None
    if "report" in options:
        for run_dir in options["report"].split(","):
            print(json.dumps(report(Path(run_dir), stop_at)), flush=True)
        return
    out = Path(options.get("out", "runs/games"))
    seed = int(options.get("seed", 0))
    for game in options.get("games", "Breakout,SpaceInvaders,Seaquest").split(","):
        run_dir = out / f"{game}-seed{seed}"
        start = time.time()
        train_and_evaluate(game, float(options.get("minutes", 40)), seed, int(options.get("episodes", 10)), run_dir,
                           stop_at, overrides)
        print(json.dumps({**report(run_dir, stop_at), "total_minutes": round((time.time() - start) / 60, 1),
                          **({"overrides": list(overrides)} if overrides else {})}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
