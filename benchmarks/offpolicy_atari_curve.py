"""The learning curve of an off-policy Atari run, against agent steps and against wall-clock minutes (a figure, not a
test): reads the run's greedy evaluations (``eval/return``, whole games) and its elapsed time (``time/elapsed_s``),
prints one JSON line per evaluation and the first agent step / minute at which the evaluation reached ``goal``, and
draws ``eval_curve.png`` (two panels) into the run directory.

    python benchmarks/offpolicy_atari_curve.py RUN_DIR [RUN_DIR ...] [goal=15]

Several run directories (seeds) are drawn in the same panels.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.logging import read_scalars  # noqa: E402


def curve(run_dir: Path) -> list[dict]:
    """One row per evaluation: agent steps, minutes of wall time at that step, greedy return."""
    import numpy as np

    steps, returns = read_scalars(run_dir, "eval/return")
    clock_steps, elapsed = read_scalars(run_dir, "time/elapsed_s")
    minutes = np.interp(steps, clock_steps, elapsed) / 60 if clock_steps else [float("nan")] * len(steps)
    return [{"env_steps": int(s), "minutes": round(float(m), 1), "eval_return": float(r)}
            for s, m, r in zip(steps, minutes, returns)]


def main(argv: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    options = dict(a.split("=", 1) for a in argv if "=" in a)
    goal = float(options.get("goal", 15))
    runs = [Path(a) for a in argv if "=" not in a]
    fig, (by_steps, by_minutes) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for run_dir in runs:
        rows = curve(run_dir)
        for row in rows:
            print(json.dumps({"bench": "offpolicy_atari_curve", "run": run_dir.name, **row}))
        reached = next((row for row in rows if row["eval_return"] >= goal), None)
        print(json.dumps({"bench": "offpolicy_atari_curve", "run": run_dir.name, "goal": goal,
                          "reached_at_env_steps": reached and reached["env_steps"],
                          "reached_at_minutes": reached and reached["minutes"],
                          "best": max((row["eval_return"] for row in rows), default=None)}))
        by_steps.plot([r["env_steps"] / 1e6 for r in rows], [r["eval_return"] for r in rows], marker="o",
                      label=run_dir.name)
        by_minutes.plot([r["minutes"] for r in rows], [r["eval_return"] for r in rows], marker="o", label=run_dir.name)
    for ax, label in ((by_steps, "agent steps (millions)"), (by_minutes, "wall-clock minutes")):
        ax.axhline(goal, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    by_steps.set_ylabel("greedy evaluation return (whole games)")
    by_minutes.legend()
    fig.tight_layout()
    out = runs[0] / "eval_curve.png"
    fig.savefig(out, dpi=100)
    print(json.dumps({"bench": "offpolicy_atari_curve", "plot": str(out)}))


if __name__ == "__main__":
    main(sys.argv[1:])
