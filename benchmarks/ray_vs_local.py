"""The Ray engine against the local one (a figure, not a test): env steps/s and optimiser updates/s of the same
algorithm and config, after prefill, with equal resources on this machine. The goal is Ray >= 80 % of local.

    python benchmarks/ray_vs_local.py [sac|dqn ...] [env_steps=N] [cpus=N] [engines=local-1env,ray-1x1,...] [pairs=3]

- local: one process, ``threads=cpus`` torch threads, ``env.num_envs=2`` envs stepped in turn (SerialEnv);
- ray: a local Ray cluster of ``cpus`` CPUs, 2 collector actors x 1 env, 2 Gloo learner ranks (global batch split
  in two) of ``cpus / 2`` torch threads each, the replay actor; every actor reserves ``cpus / 4`` CPUs;
- ray-1rank: the same with one learner rank of ``cpus`` torch threads (no gradient all-reduce);
- local-1env / ray-1x1: one env, against one collector actor x 1 env and one learner rank (each actor ``cpus / 2``
  CPUs): the issue's "one collector, one learner rank" case, compared with local-1env.

Each case is a fresh ``python -m offpolicy.train`` with evaluation off and metrics logged every round; the figures are
env_steps (or updates) between the end of the prefill round and the end of the run over the wall time between them (so
Ray's start-up is not counted). The engines run in turn, ``pairs`` times over (one run is not a figure: the
machine's speed drifts), each time giving a ratio to its local baseline; the summary lines carry the medians and the
ratio's range (``over_local_median``, ``_min``, ``_max``: quote the median). Prints JSON lines and appends them to
benchmarks/results/ray_vs_local.jsonl.
"""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.logging import read_scalars  # noqa: E402

COMMON = ["optim.utd_ratio=1", "optim.batch_size=256", "model.hidden=[256,256]", "collector.env_steps_per_batch=1000",
          "collector.prefill_env_steps=1000", "eval.interval_env_steps=0", "eval.final_episodes=0", "logger.interval_s=0",
          "logger.progress_bar=false", "checkpoint.interval_s=0", "env.num_envs=1"]
CASES = {"sac": ["algo=sac", "env=HalfCheetah-v5"], "dqn": ["algo=dqn", "env=CartPole-v1"]}


ENGINES = ("local", "ray", "ray-1rank", "local-1env", "ray-1x1")
BASELINE = {"ray": "local", "ray-1rank": "local", "ray-1x1": "local-1env"}


def engine_args(engine: str, cpus: int) -> list[str]:
    if engine == "local":
        return [f"threads={cpus}", "env.num_envs=2", "env.vector=serial"]
    if engine == "local-1env":
        return [f"threads={cpus}"]
    if engine == "ray-1x1":
        return ["engine=ray", f"ray.num_cpus={cpus}", "ray.num_collectors=1", f"ray.collector_cpus={cpus / 2}",
                "ray.world_size=1", f"ray.learner_cpus={cpus / 2}", f"threads={cpus}"]
    share = cpus / 4
    # torch threads as locally: cpus in all, so one per rank with two ranks
    ranks = ["ray.world_size=2", f"ray.learner_cpus={share}", f"threads={max(cpus // 2, 1)}"] if engine == "ray" \
        else ["ray.world_size=1", f"ray.learner_cpus={2 * share}", f"threads={cpus}"]
    return ["engine=ray", f"ray.num_cpus={cpus}", "ray.num_collectors=2", f"ray.collector_cpus={share}", *ranks]


def measure(name: str, engine: str, env_steps: int, cpus: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "offpolicy.train", *CASES[name], *COMMON, *engine_args(engine, cpus),
               f"total_env_steps={env_steps}", f"run_dir={tmp}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{name}/{engine} failed: {proc.stderr[-2000:]}")
        steps, optim = read_scalars(tmp, "train/optim_steps")
        _, elapsed = read_scalars(tmp, "time/elapsed_s")
        _, env_steps_logged = read_scalars(tmp, "train/env_steps")
    first = next(i for i in range(1, len(optim)) if optim[i] > optim[i - 1]) - 1  # end of the prefill round
    wall = elapsed[-1] - elapsed[first]
    return {"env_steps_per_s": (env_steps_logged[-1] - env_steps_logged[first]) / wall,
            "updates_per_s": (optim[-1] - optim[first]) / wall, "rounds": len(optim) - 1 - first}


def main(argv: list[str]) -> None:
    names = [a for a in argv if "=" not in a] or list(CASES)
    opts = dict(a.split("=", 1) for a in argv if "=" in a)
    env_steps, cpus, pairs = int(opts.get("env_steps", 6000)), int(opts.get("cpus", 2)), int(opts.get("pairs", 3))
    out = ROOT / "benchmarks" / "results" / "ray_vs_local.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "env_steps": env_steps, "cpus": cpus, "host": platform.node()}
    engines = opts["engines"].split(",") if "engines" in opts else ENGINES

    def emit(line: dict) -> None:
        print(json.dumps(line), flush=True)
        with out.open("a") as f:
            f.write(json.dumps({**line, **meta}) + "\n")

    for name in names:
        ratios: dict[str, list[float]] = {engine: [] for engine in BASELINE if engine in engines}
        speeds: dict[str, list[float]] = {engine: [] for engine in engines}
        for pair in range(pairs):  # alternated: every engine once per pair, so a drift of the machine hits all
            results = {engine: measure(name, engine, env_steps, cpus) for engine in engines}
            for engine, r in results.items():
                speeds[engine].append(r["env_steps_per_s"])
                for metric, unit in (("env_steps_per_s", "steps/s"), ("updates_per_s", "updates/s")):
                    emit({"bench": f"ray_vs_local/{name}/{engine}", "metric": metric, "value": round(r[metric], 1),
                          "unit": unit, "pair": pair})
            for engine in ratios:
                if BASELINE[engine] in results:
                    ratios[engine].append(results[engine]["env_steps_per_s"] /
                                          results[BASELINE[engine]]["env_steps_per_s"])
                    emit({"bench": f"ray_vs_local/{name}/{engine}", "metric": "over_local",
                          "value": round(ratios[engine][-1], 3), "unit": "ratio", "goal": 0.8, "pair": pair})
        for engine, values in speeds.items():
            emit({"bench": f"ray_vs_local/{name}/{engine}", "metric": "env_steps_per_s_median",
                  "value": round(statistics.median(values), 1), "unit": "steps/s", "pairs": pairs})
        for engine, values in ratios.items():
            if values:
                for metric, value in (("over_local_median", statistics.median(values)),
                                      ("over_local_min", min(values)), ("over_local_max", max(values))):
                    emit({"bench": f"ray_vs_local/{name}/{engine}", "metric": metric, "value": round(value, 3),
                          "unit": "ratio", "goal": 0.8, "pairs": pairs})


if __name__ == "__main__":
    main(sys.argv[1:])
