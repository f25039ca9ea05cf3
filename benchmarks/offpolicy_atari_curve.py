"""The learning curve of an off-policy Atari run, against agent steps and against wall-clock minutes (a figure, not a
test): reads the run's greedy evaluations (``eval/return``, whole games) and its elapsed time (``time/elapsed_s``),
prints one JSON line per evaluation and the first agent step / minute at which the evaluation reached ``goal``, and
draws ``eval_curve.png`` (two panels) into the run directory; the points drawn go to each run's ``curves.json``, so a
results copy that keeps only that file can be drawn again (benchmarks/plot_results.py).

    python benchmarks/offpolicy_atari_curve.py RUN_DIR [RUN_DIR ...] [goal=15]

Several run directories (seeds) are drawn in the same panels.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.config import ConfigError  # noqa: E402
from shared.plots import evaluations, plot_eval_curve  # noqa: E402


def main(argv: list[str]) -> None:
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    goal = float(options.get("goal", 15))
    runs = [Path(a) for a in argv if "=" not in a]
    for run_dir in runs:
        rows = evaluations(run_dir)
        for row in rows:
            print(json.dumps({"bench": "offpolicy_atari_curve", "run": run_dir.name, **row}))
        reached = next((row for row in rows if row["eval_return"] >= goal), None)
        print(json.dumps({"bench": "offpolicy_atari_curve", "run": run_dir.name, "goal": goal,
                          "reached_at_env_steps": reached and reached["env_steps"],
                          "reached_at_minutes": reached and reached["minutes"],
                          "best": max((row["eval_return"] for row in rows), default=None)}))
    print(json.dumps({"bench": "offpolicy_atari_curve", "plot": str(plot_eval_curve(runs, goal))}))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except ConfigError as exc:  # a run without evaluations, or a malformed curves.json
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
