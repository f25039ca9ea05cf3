"""Two versions of the A3C worker loop at the same time, one process each, as JSON lines (figures, not a test).

    python benchmarks/a3c_side_by_side.py a=PATH [b=PATH] [seconds=15] [pairs=8] [any a3c key=value ...]

``a`` and ``b`` are checkouts of this repository (``b`` defaults to this one; ``a=`` this one too gives an A/A
check of the method's resolution). Each pair runs one process of each at the same time, each playing the default
game through the real ``Rollout`` and ``A3CLearner`` (sync, roll out, update, as ``a3c.worker`` does) for ``seconds``
after a warm-up, and prints both rates and ``b/a``; the last line is the median and range of ``b/a``. Why side by
side: this host's speed drifts by tens of percent within minutes, so two versions measured one after the other differ
by the drift; running at the same time, both see it. Which one starts first alternates between pairs.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "a3c_side_by_side.jsonl"

WORKER_LOOP = r'''
import json, os, sys, time
sys.path.insert(0, os.getcwd())  # the checkout under test, before any installed copy
import torch
from a3c.config import load_config
from a3c.model import build_model
from a3c.learner import A3CLearner
from a3c.optim import make_shared_optimizer
from a3c.rollout import Rollout
from shared.atari import AtariBatch, AtariSettings

torch.set_num_threads(1)
seed, seconds = int(sys.argv[1]), float(sys.argv[2])
cfg = load_config(sys.argv[3:])
env = AtariBatch(AtariSettings.from_config(cfg.env), cfg.env.envs_per_worker, seed=seed)
global_model = build_model(cfg, env.num_actions).share_memory()
local = build_model(cfg, env.num_actions)
learner = A3CLearner.from_config(cfg, local, global_model, make_shared_optimizer(global_model.parameters(), cfg.optim))
rollout = Rollout(env, cfg.a3c.t_max)
steps_per_rollout = cfg.env.envs_per_worker * cfg.a3c.t_max


def one_update():
    learner.sync()
    batch, _ = rollout.collect(local)
    learner.update(batch, rollout.start_state)


for _ in range(5):  # warm-up excluded
    one_update()
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    one_update()
    steps += steps_per_rollout
print(json.dumps({"rate": steps / (time.perf_counter() - start)}))
'''


def start(checkout: str, seed: int, seconds: float, overrides: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WORKER_LOOP, str(seed), str(seconds), *overrides], cwd=checkout,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, text=True)


def rate(proc: subprocess.Popen) -> float:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"a worker loop exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])["rate"]


def main(argv: list[str]) -> None:
    own = {"a": None, "b": str(REPO), "seconds": "15", "pairs": "8"}
    overrides = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in own:
            own[key] = value
        else:
            overrides.append(arg)
    if own["a"] is None:
        raise SystemExit("a=PATH (a checkout of this repository) is required")
    a, b = str(Path(own["a"]).resolve()), str(Path(own["b"]).resolve())
    seconds, pairs = float(own["seconds"]), int(own["pairs"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    ratios = []
    for pair in range(pairs):
        if pair % 2:
            proc_b, proc_a = start(b, pair, seconds, overrides), start(a, pair, seconds, overrides)
        else:
            proc_a, proc_b = start(a, pair, seconds, overrides), start(b, pair, seconds, overrides)
        rate_a, rate_b = rate(proc_a), rate(proc_b)
        ratios.append(rate_b / rate_a)
        line = {"bench": "a3c_side_by_side", "pair": pair, "a": a, "b": b, "a_rate": round(rate_a, 1),
                "b_rate": round(rate_b, 1), "b_over_a": round(rate_b / rate_a, 4), "overrides": overrides}
        print(json.dumps(line), flush=True)
        with RESULTS.open("a") as f:
            f.write(json.dumps(line) + "\n")
    summary = {"bench": "a3c_side_by_side", "metric": "median/b_over_a", "value": round(statistics.median(ratios), 4),
               "low": round(min(ratios), 4), "high": round(max(ratios), 4), "pairs": pairs, "a": a, "b": b}
    print(json.dumps(summary), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
