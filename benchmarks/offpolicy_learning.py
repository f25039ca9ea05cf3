"""Learning benchmark of the off-policy engine (a figure, not a test): each case trains with
``python -m offpolicy.train`` and reports the first frame count at which the deterministic evaluation return reaches
the target. Prints JSON lines and keeps summaries and curves under benchmarks/results/offpolicy_learning/.

    nice -n 5 python benchmarks/offpolicy_learning.py [case ...]      # cases: dqn-cartpole sac-pendulum ...
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.logging import read_scalars  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "offpolicy_learning"
PENDULUM = ["env=Pendulum-v1", "total_frames=20000", "collector.frames_per_batch=200", "collector.prefill_frames=1000",
            "eval.interval_frames=1000", "eval.episodes=5", "eval.max_episode_steps=200"]
# name: (overrides, target return, frame budget)
CASES = {
    "dqn-cartpole": (["algo=dqn", "env=CartPole-v1", "total_frames=50000", "eval.interval_frames=2500",
                      "eval.episodes=5"], 500.0, 50_000),
    "sac-pendulum": (["algo=sac", *PENDULUM], -200.0, 20_000),
    "td3-pendulum": (["algo=td3", *PENDULUM], -200.0, 20_000),
    "ddpg-pendulum": (["algo=ddpg", *PENDULUM], -200.0, 20_000),
    # the DDPG tutorial's data pipeline together: TD(lambda) on 8-step slices, prioritized memmap replay, ObservationNorm
    "ddpg-pendulum-options": (["algo=ddpg", *PENDULUM, "loss.value_estimator=tdlambda", "replay.slice_len=8",
                               "replay.prioritized=true", "replay.storage=memmap", "env.obs_norm=true"], -200.0, 20_000),
    "sac-halfcheetah": (["algo=sac", "env=HalfCheetah-v5", "total_frames=1000000", "eval.interval_frames=10000",
                         "checkpoint.interval_s=300"], None, 1_000_000),
    "td3-halfcheetah": (["algo=td3", "env=HalfCheetah-v5", "total_frames=1000000", "eval.interval_frames=10000",
                         "checkpoint.interval_s=300"], None, 1_000_000),
}


def run_case(name: str, extra: list[str]) -> dict:
    overrides, target, budget = CASES[name]
    run_dir = RESULTS / name
    if run_dir.exists() and not any(a.startswith("resume=") for a in extra):
        shutil.rmtree(run_dir)
    t0 = time.time()
    cmd = [sys.executable, "-m", "offpolicy.train", *overrides, f"run_dir={run_dir}", "logger.progress_bar=false",
           *extra]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    steps, returns = read_scalars(run_dir, "eval/return")
    reached = next((int(s) for s, r in zip(steps, returns) if target is not None and r >= target), None)
    result = {
        "case": name, "exit_code": proc.returncode, "target": target, "budget_frames": budget,
        "reached_at_frames": reached, "passed": reached is not None and reached <= budget,
        "eval_returns": [[int(s), round(r, 1)] for s, r in zip(steps, returns)],
        "best_eval_return": max(returns) if returns else None, "wall_s": round(time.time() - t0, 1),
    }
    summary = run_dir / "summary.json"
    if summary.exists():
        result["summary"] = json.loads(summary.read_text())
    for bulky in ("checkpoints", "replay"):  # keep the results folder small (replay: memmap files)
        shutil.rmtree(run_dir / bulky, ignore_errors=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str]) -> None:
    names = [a for a in argv if "=" not in a] or ["dqn-cartpole", "sac-pendulum", "td3-pendulum", "ddpg-pendulum"]
    extra = [a for a in argv if "=" in a]
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in names:
        r = run_case(name, extra)
        for metric, unit in (("reached_at_frames", "frames"), ("best_eval_return", "return"), ("wall_s", "s")):
            print(json.dumps({"bench": f"offpolicy_learning/{name}", "metric": metric, "value": r[metric],
                              "unit": unit}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
