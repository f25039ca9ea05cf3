"""What ``collector.overlap=true`` (the collector in a child process, one batch ahead) gains (a figure, not a test):
learning-phase env steps/s of the same run with and without it, in alternated pairs (off, on, off, on, ...), each
pair's ratio on/off and their median. The run without overlap is the same-run reference.

    nice -n 5 python benchmarks/offpolicy_overlap_gain.py [case ...] [pairs=3]

Cases: ``dqn-atari`` (``profile=atari`` on Pong: 10 envs, UTD 0.1, batch 32, frames stored once; 10k prefill, then
20k learning-phase agent steps), ``dqn`` (DQN's default command: CartPole-v1, UTD 0.5, batch 64, 256-step rounds,
one torch thread; 20k env steps), ``dqn-cleanrl`` (CartPole at CleanRL's setting, as in
benchmarks/offpolicy_throughput.py) and ``sac`` (HalfCheetah-v5, UTD 1, batch 256). Every run takes the default
command's compile path (``compile.enabled`` as ``auto`` decides for the full-length run). Prints JSON lines and appends
them to benchmarks/results/offpolicy_overlap_gain.jsonl (with the time and host).
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from offpolicy_throughput import CASES, default_compile, measure  # noqa: E402

QUIET = ["eval.interval_env_steps=0", "eval.final_episodes=0", "logger.interval_s=0", "logger.progress_bar=false",
         "checkpoint.interval_s=0"]  # no evaluation or checkpoint inside the measured rounds; metrics every round
ATARI = ["algo=dqn", "profile=atari", "env=Pong", *QUIET]
# name -> (the case's arguments, env steps per round, env steps per run, torch threads)
GAIN_CASES = {
    "dqn-atari": (ATARI, 500, 30_000, 2),
    "dqn": (["algo=dqn", *QUIET], 256, 20_000, 1),
    "dqn-cleanrl": (CASES["dqn-cleanrl"], 1000, 20_000, 1),
    "sac": (CASES["sac"], 1000, 6000, 2),
}


def main(argv: list[str]) -> None:
    names = [a for a in argv if "=" not in a] or list(GAIN_CASES)
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = (set(options) - {"pairs"}) | (set(names) - set(GAIN_CASES))
    if unknown:
        raise SystemExit(f"unknown {', '.join(sorted(unknown))}; cases: {', '.join(GAIN_CASES)}; options: pairs=")
    pairs = int(options.get("pairs", 3))
    out = ROOT / "benchmarks" / "results" / "offpolicy_overlap_gain.jsonl"
    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node()}

    def emit(name: str, metric: str, value: float, unit: str, **extra) -> None:
        line = {"bench": f"offpolicy_overlap_gain/{name}", "metric": metric, "value": round(value, 3), "unit": unit,
                **extra}
        print(json.dumps(line), flush=True)
        with out.open("a") as f:
            f.write(json.dumps({**line, **meta}) + "\n")

    for name in names:
        case, batch, env_steps, threads = GAIN_CASES[name]
        compiled = default_compile(case, [])
        ratios = []
        for pair in range(pairs):
            off, on = (measure(name, env_steps, threads, [*compiled, f"collector.overlap={flag}"], case=case,
                               batch=batch)["env_steps_per_s"] for flag in ("false", "true"))
            ratios.append(on / off)
            emit(name, "env_steps_per_s_overlap_off", off, "steps/s", pair=pair, overrides=compiled)
            emit(name, "env_steps_per_s_overlap_on", on, "steps/s", pair=pair, overrides=compiled)
            emit(name, "overlap_gain", on / off, "x", pair=pair, overrides=compiled)
        emit(name, "overlap_gain_median", statistics.median(ratios), "x", pairs=pairs, range=[min(ratios), max(ratios)],
             overrides=compiled)


if __name__ == "__main__":
    main(sys.argv[1:])
