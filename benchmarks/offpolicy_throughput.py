"""Throughput of the off-policy engine (a figure, not a test): env steps/s and optimiser updates/s in the learning
phase (after prefill and the first learning batch, the warm-up), at UTD 1, batch 256 and 256x256 MLPs; SAC, TD3 and
DDPG on HalfCheetah-v5, DQN on CartPole-v1 (plus DQN at CleanRL's own setting, 1 update per 10 steps with batch 128,
to compare with its 4,315 steps/s).

    nice -n 5 python benchmarks/offpolicy_throughput.py [algo ...] [env_steps=6000] [threads=auto] [pairs=3]
                                                        [section.key=value ...]

``threads`` is the engine's torch threads (default ``auto``, the default command's: every core, as the reference
uses torch's default). Any further
``key=value`` whose key has a dot (``compile.enabled=true``) is passed on to the engine's ``python -m offpolicy.train``
command line after the case's own settings (so it wins), e.g. to measure the compiled learner; the reference is
unchanged. Without a ``compile.enabled=`` the run takes the path the case's full-length default command takes
(``compile.enabled=auto`` decided on its whole run, not on the short slice measured here). Every line records the
overrides the engine ran with (``overrides``).

Each engine run is a fresh ``python -m offpolicy.train`` with evaluation off and metrics logged every batch; its
figures are learning-phase env steps (or updates) over the wall time of those batches (collection + learning), and
over the process's CPU time (``*_per_cpu_s``: the figure that stays meaningful when other jobs share the 2 cores;
one torch thread, so a CPU-second is a core-second).

Each engine run is followed by benchmarks/offpolicy_reference.py, the same work in plain PyTorch + Gymnasium the
CleanRL way (one env, a tensor ring buffer, the same networks, batch, UTD, prefill and targets; torch's default
threads), in its own fresh process and for as many learning-phase steps as that engine run's learning-phase env steps:
``reference_env_steps_per_s`` is its figure and ``ratio_to_reference`` the engine's ``env_steps_per_s`` over it
(above 1: the engine is faster). Both DQN cases get a reference at their own UTD, batch and hidden sizes.

How to read it: the machine's speed drifts (a single ratio varied 0.66-1.13 for SAC within two days), so each case
runs ``pairs`` alternated pairs (engine, reference, engine, reference, ...) and every pair gives its own ratio. The
per-pair lines carry ``"pair": i``; the case's figures are the summary lines after them: ``*_median`` over the pairs
(engine metrics, ``reference_env_steps_per_s_median``, ``ratio_to_reference_median``: quote this one) and
``ratio_to_reference_min`` / ``_max`` (the spread; a wide one means the machine was busy, so measure again).

Prints JSON lines and appends them to benchmarks/results/offpolicy_throughput.jsonl (with the time, env_steps,
threads and host; summary lines also carry ``pairs``).
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
          "logger.progress_bar=false", "checkpoint.interval_s=0"]
CASES = {
    "sac": ["algo=sac", "env=HalfCheetah-v5", *COMMON],
    "td3": ["algo=td3", "env=HalfCheetah-v5", *COMMON],
    "ddpg": ["algo=ddpg", "env=HalfCheetah-v5", *COMMON],
    "dqn": ["algo=dqn", "env=CartPole-v1", *COMMON],
    # CleanRL dqn.py's settings, its budget (total_timesteps 500k, which the measured slice cuts short) included
    "dqn-cleanrl": ["algo=dqn", "env=CartPole-v1", *COMMON, "optim.utd_ratio=0.1", "optim.batch_size=128",
                    "model.hidden=[120,84]", "total_env_steps=500000"],
}
PREFILL = 1000  # collector.prefill_env_steps in COMMON
# benchmarks/offpolicy_reference.py arguments of each case (same algorithm, UTD, batch and hidden sizes)
REFERENCE = {
    "sac": ["sac"], "td3": ["td3"], "ddpg": ["ddpg"],
    "dqn": ["dqn", "utd=1", "batch=256", "hidden=256,256"],
    "dqn-cleanrl": ["dqn", "utd=0.1", "batch=128", "hidden=120,84"],
}


METRICS = (("env_steps_per_s", "steps/s"), ("updates_per_s", "updates/s"), ("env_steps_per_cpu_s", "steps/cpu-s"),
           ("updates_per_cpu_s", "updates/cpu-s"), ("learner_updates_per_s", "updates/s"),
           ("collector_steps_per_s", "steps/s"), ("reference_env_steps_per_s", "steps/s"), ("ratio_to_reference", "x"))


def measure(name: str, env_steps: int, threads: int | str, overrides: list[str], case: list[str] | None = None,
            batch: int = 1000) -> dict:
    """Learning-phase figures of one ``python -m offpolicy.train`` run of ``case`` (default ``CASES[name]``) for
    ``env_steps`` env steps, whose rounds collect ``batch`` env steps each."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "offpolicy.train", *(CASES[name] if case is None else case),
               f"total_env_steps={env_steps}", f"threads={threads}", f"run_dir={tmp}", *overrides]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed: {proc.stderr[-2000:]}")
        _, optim = read_scalars(tmp, "train/optim_steps")
        _, sps = read_scalars(tmp, "time/env_steps_per_s")
        _, ups = read_scalars(tmp, "time/updates_per_s")
        _, fps = read_scalars(tmp, "collector/env_steps_per_s")
        _, cpu = read_scalars(tmp, "time/cpu_s")
        _, env_steps_logged = read_scalars(tmp, "train/env_steps")
    # one window per batch (logger.interval_s=0); keep the learning batches after the first one, whose window holds the
    # learner's warm-up (torch.compile compiles there with compile.enabled=true), the same for eager and compiled runs
    learning = [i for i in range(len(optim)) if i > 0 and optim[i] > optim[i - 1]][1:]
    wall = sum(batch / sps[i] for i in learning)
    updates = optim[learning[-1]] - optim[learning[0] - 1]
    first, last = learning[0] - 1, learning[-1]  # from the end of the warm-up batch to the end of the run
    cpu_s = cpu[last] - cpu[first]
    return {"env_steps_per_s": len(learning) * batch / wall, "updates_per_s": updates / wall,
            "env_steps_per_cpu_s": (env_steps_logged[last] - env_steps_logged[first]) / cpu_s,
            "updates_per_cpu_s": (optim[last] - optim[first]) / cpu_s,
            "learner_updates_per_s": sum(ups[i] for i in learning) / len(learning),
            "collector_steps_per_s": sum(fps[i] for i in learning) / len(learning), "env_steps": env_steps,
            "learning_env_steps": len(learning) * batch}


def default_compile(case: list[str], overrides: list[str]) -> list[str]:
    """``compile.enabled=`` as the full-length default run of ``case`` (its arguments) decides it (offpolicy/compiling.py: ``auto`` looks
    at the whole run's planned optimiser steps, which this benchmark's short slice would not reach), unless
    ``overrides`` set it: so a run without a compile flag measures the path the default command takes."""
    if any(o.startswith("compile.enabled=") for o in overrides):
        return []
    from offpolicy.compiling import compile_choice
    from offpolicy.config import compose_config

    cfg, _ = compose_config([*case, *overrides])
    return [f"compile.enabled={str(compile_choice(cfg).enabled).lower()}"]


def measure_reference(name: str, steps: int) -> float:
    """env steps/s of the plain-PyTorch reference for case ``name`` over ``steps`` learning-phase steps, in a fresh
    process (its own torch threads)."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "offpolicy_reference.py"), *REFERENCE[name], f"steps={steps}",
           f"prefill={PREFILL}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"reference {name} failed: {proc.stderr[-2000:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return next(line["value"] for line in lines if line["metric"] == "env_steps_per_s")


def main(argv: list[str]) -> None:
    names = [a for a in argv if "=" not in a] or list(CASES)
    options = dict(a.split("=", 1) for a in argv if "=" in a and "." not in a.split("=", 1)[0])
    overrides = [a for a in argv if "=" in a and "." in a.split("=", 1)[0]]
    unknown = (set(options) - {"env_steps", "threads", "pairs"}) | (set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown {', '.join(sorted(unknown))}; cases: {', '.join(CASES)}; options: env_steps=, "
                         "threads=, pairs=, section.key=value (passed to offpolicy.train)")
    env_steps, threads = int(options.get("env_steps", 6000)), options.get("threads", "auto")
    pairs = int(options.get("pairs", 3))
    out = ROOT / "benchmarks" / "results" / "offpolicy_throughput.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta = {"time": stamp, "env_steps": env_steps, "threads": threads, "host": platform.node()}

    def emit(name: str, metric: str, value: float, unit: str, **extra) -> None:
        digits = 3 if metric.startswith("ratio_to_reference") else 1
        line = {"bench": f"offpolicy_throughput/{name}", "metric": metric, "value": round(value, digits), "unit": unit,
                **extra}
        print(json.dumps(line), flush=True)
        with out.open("a") as f:
            f.write(json.dumps({**line, **meta}) + "\n")

    for name in names:
        case_overrides = [*overrides, *default_compile(CASES[name], overrides)]
        runs = []
        for pair in range(pairs):  # alternated: engine, reference, engine, reference, ...
            r = measure(name, env_steps, threads, case_overrides)
            r["reference_env_steps_per_s"] = measure_reference(name, r["learning_env_steps"])
            r["ratio_to_reference"] = r["env_steps_per_s"] / r["reference_env_steps_per_s"]
            runs.append(r)
            for metric, unit in METRICS:
                emit(name, metric, r[metric], unit, pair=pair, overrides=case_overrides)
        for metric, unit in METRICS:
            emit(name, f"{metric}_median", statistics.median(r[metric] for r in runs), unit, pairs=pairs,
                 overrides=case_overrides)
        ratios = [r["ratio_to_reference"] for r in runs]
        emit(name, "ratio_to_reference_min", min(ratios), "x", pairs=pairs, overrides=case_overrides)
        emit(name, "ratio_to_reference_max", max(ratios), "x", pairs=pairs, overrides=case_overrides)


if __name__ == "__main__":
    main(sys.argv[1:])
