"""The plan's wall-time prediction against a real run of the same config on this machine.

    python benchmarks/plan_vs_run.py [algo=sac] [profile=scale_rehearsal] [key=value ...]

First ``python -m offpolicy.tools.plan`` measures the rates here and predicts the run (its JSON line); then
``python -m offpolicy.train`` runs the same config in a fresh process. Compared: the whole wall time (the train
process, start to exit) and the per-round collect and learn times (from
the run's ``collector/env_steps_per_s``, which covers the replay write, and ``time/updates_per_s``). Goal: the prediction within 30 % of the measured
wall time. Run it on an idle machine. Prints JSON lines and appends them to benchmarks/results/plan_vs_run.jsonl; the
run's directory is kept under benchmarks/results/plan_vs_run/<algo>-<profile>/.
"""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.logging import read_scalars  # noqa: E402

GOAL = 0.30  # |predicted - measured| / measured


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def main(argv: list[str]) -> None:
    args = {"algo": "sac", "profile": "scale_rehearsal"}
    args.update(a.split("=", 1) for a in argv)
    overrides = [f"{k}={v}" for k, v in args.items()]
    name = f"{args['algo']}-{args['profile']}"
    plan_out = subprocess.run([sys.executable, "-m", "offpolicy.tools.plan", *overrides], cwd=ROOT,
                              capture_output=True, text=True, check=True)
    plan = json.loads(plan_out.stdout.strip().splitlines()[-1])
    timing = plan["timing"]
    run_dir = ROOT / "benchmarks" / "results" / "plan_vs_run" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "offpolicy.train", *overrides, f"run_dir={run_dir}",
                    "logger.progress_bar=false"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=2))  # the prediction beside the run it predicted
    summary = json.loads((run_dir / "summary.json").read_text())
    _, collect_rate = read_scalars(run_dir, "collector/env_steps_per_s")
    _, update_rate = read_scalars(run_dir, "time/updates_per_s")
    per_round = plan["env_steps_per_round"]
    measured = {
        "wall_s": wall,
        "collect_round_s": per_round / _mean(collect_rate),
        "learn_round_s": plan["optim_steps_per_round"] / _mean(r for r in update_rate if r > 0),
    }
    predicted = {
        "wall_s": timing["total_s"],
        "collect_round_s": timing["round_parts_s"]["collect"] + timing["round_parts_s"]["replay_write"],
        "learn_round_s": timing["round_parts_s"]["learn"],
    }
    out = ROOT / "benchmarks" / "results" / "plan_vs_run.jsonl"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    for metric in measured:
        line = {"bench": f"plan_vs_run/{name}", "metric": metric, "predicted": round(predicted[metric], 3),
                "measured": round(measured[metric], 3), "unit": "s",
                "error": round((predicted[metric] - measured[metric]) / measured[metric], 3)}
        if metric == "wall_s":
            line["within_goal"] = abs(line["error"]) <= GOAL
            line.update(bound=timing["bound"], predicted_prefill_s=round(timing["prefill_s"], 1))
        print(json.dumps(line), flush=True)
        with out.open("a") as f:
            f.write(json.dumps({**line, "time": stamp, "host": platform.node(), "overrides": overrides,
                                "status": summary["status"]}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
