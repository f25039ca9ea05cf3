"""The learner step on 1 torch thread against every core (a figure, not a test): what ``threads: auto`` rests on.
For each case, the engine's learner (its chunked samples, checks, loss, backward, optimiser steps and target
update, compiled where the case's full-length default run compiles) takes rounds of 100 steps on one collected batch,
alternating 1 thread and ``threads`` threads, three rounds each; prints the median ms per step of each and their
ratio (``speedup``: above 1, more threads are faster), with the case's parameters x batch size.

    nice -n 5 python benchmarks/offpolicy_learner_threads.py [case ...] [threads=N]   (N: default os.cpu_count())

Prints JSON lines and appends them to benchmarks/results/offpolicy_learner_threads.jsonl.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from offpolicy import prepare_process  # noqa: E402
from offpolicy.builder import Builder  # noqa: E402
from offpolicy.config import compose_config  # noqa: E402
from offpolicy.envs import make_train_env  # noqa: E402
from offpolicy.learner import make_learner  # noqa: E402
from offpolicy.replay import make_replay_buffer  # noqa: E402

# name -> (arguments, compiled: as compile.enabled=auto decides the case's full-length default run)
CASES = {
    "dqn": (["algo=dqn", "env=CartPole-v1"], False),  # DQN's default command: batch 64, 256x256
    "dqn-cleanrl": (["algo=dqn", "env=CartPole-v1", "optim.batch_size=128", "model.hidden=[120,84]"], True),
    "sac": (["algo=sac", "env=HalfCheetah-v5"], True),
    "td3": (["algo=td3", "env=HalfCheetah-v5"], True),
    "ddpg": (["algo=ddpg", "env=HalfCheetah-v5"], True),
    "td3-batch64": (["algo=td3", "env=HalfCheetah-v5", "optim.batch_size=64"], True),
    "td3-hidden64": (["algo=td3", "env=HalfCheetah-v5", "model.hidden=[64,64]"], True),
}
STEPS, ROUNDS = 100, 3


def measure(name: str, threads: int) -> dict:
    args, compiled = CASES[name]
    cfg, _ = compose_config([*args, "collector.env_steps_per_batch=1000", "collector.prefill_env_steps=1000",
                             f"compile.enabled={str(compiled).lower()}"])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    replay = make_replay_buffer(cfg)
    try:
        replay.extend(next(iter(collector)).reshape(-1))
    finally:
        collector.shutdown()
    learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(cfg.optim.batch_size,))
    learner.update(replay, max(learner.warmup_steps, 20), version=1)  # compiles here where compiled
    ms = {1: [], threads: []}
    for _ in range(ROUNDS):
        for n in (1, threads):  # alternated: the host's drift hits both alike
            torch.set_num_threads(n)
            learner.update(replay, 10, version=1)
            start = time.perf_counter()
            learner.update(replay, STEPS, version=1)
            ms[n].append((time.perf_counter() - start) / STEPS * 1000)
    params = sum(p.numel() for opt in parts.optimizers.values() for g in opt.param_groups for p in g["params"])
    one, many = statistics.median(ms[1]), statistics.median(ms[threads])
    return {"compiled": compiled, "batch_size": cfg.optim.batch_size, "params": params,
            "params_x_batch": params * cfg.optim.batch_size, "ms_1_thread": round(one, 3),
            f"ms_{threads}_threads": round(many, 3), "speedup": round(one / many, 3)}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux): the figures differ between this project's hosts."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def main(argv: list[str]) -> None:
    names = [a for a in argv if "=" not in a] or list(CASES)
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = (set(options) - {"threads"}) | (set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown {', '.join(sorted(unknown))}; cases: {', '.join(CASES)}; options: threads=")
    threads = int(options.get("threads", os.cpu_count() or 1))
    out = ROOT / "benchmarks" / "results" / "offpolicy_learner_threads.jsonl"
    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": threads, "host": platform.node(), "cpu": cpu_model()}
    for name in names:
        line = {"bench": f"offpolicy_learner_threads/{name}", **measure(name, threads)}
        print(json.dumps(line), flush=True)
        with out.open("a") as f:
            f.write(json.dumps({**line, **meta}) + "\n")
        torch.compiler.reset()  # each case compiles from scratch


if __name__ == "__main__":
    prepare_process()  # as every process that runs the engine's code
    main(sys.argv[1:])
