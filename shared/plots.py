"""Learning-curve PNGs and the small file they can be redrawn from.

Whatever draws a PNG into a run directory here also records, in the run's ``curves.json``, the points it drew and how
it drew them: ``{"metrics": {metric: [[step, value], ...]}, "plots": {png name: spec}}``. benchmarks/results keeps
that file instead of the run's per-metric CSV logs, and ``benchmarks/plot_results.py`` redraws every PNG from it."""
from __future__ import annotations

import json
import os
from pathlib import Path

from shared.config import ConfigError
from shared.logging import read_scalars

CURVES_FILE = "curves.json"
# each kind of plot and the keys its spec needs
PLOT_KINDS = {"curves": ("title", "xlabel", "series", "smooth"), "eval_curve": ("goal", "runs")}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_curves(run_dir: str | Path) -> dict:
    """A run's ``curves.json`` (``{"metrics": {}, "plots": {}}`` when it has none); ConfigError if it is malformed."""
    path = Path(run_dir) / CURVES_FILE
    if not path.exists():
        return {"metrics": {}, "plots": {}}
    try:
        curves = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); allowed: the file shared/plots.py writes") from None
    check_curves(curves, str(path))
    return curves


def check_curves(curves, where: str) -> None:
    """ConfigError naming ``where`` unless ``curves`` is ``{"metrics": {name: [[step, value], ...]}, "plots": {...}}``
    with every plot's spec naming a known ``kind``."""
    if not isinstance(curves, dict) or not isinstance(curves.get("metrics"), dict) \
            or not isinstance(curves.get("plots"), dict):
        raise ConfigError(f"{where}: needs the keys metrics and plots, each a mapping; allowed: "
                          '{"metrics": {name: [[step, value], ...]}, "plots": {png name: spec}}')
    for name, points in curves["metrics"].items():
        if not isinstance(points, list) or not all(isinstance(p, list) and len(p) == 2 for p in points):
            raise ConfigError(f"{where}: metrics.{name} is not a list of [step, value] pairs")
    for name, spec in curves["plots"].items():
        kind = spec.get("kind") if isinstance(spec, dict) else None
        if kind not in PLOT_KINDS:
            raise ConfigError(f"{where}: plots.{name}.kind is {kind!r}; allowed: {', '.join(PLOT_KINDS)}")
        missing = [key for key in PLOT_KINDS[kind] if key not in spec]
        if missing:
            raise ConfigError(f"{where}: plots.{name} lacks {', '.join(missing)}; a {kind} plot needs "
                              f"{', '.join(PLOT_KINDS[kind])}")


def record_curves(run_dir: str | Path, metrics: dict[str, tuple[list, list]], plots: dict[str, dict]) -> dict:
    """Add ``metrics`` (name -> (steps, values)) and ``plots`` (png name -> spec) to the run's ``curves.json``; the
    file's content after the change."""
    curves = read_curves(run_dir)
    for name, (steps, values) in metrics.items():
        curves["metrics"][name] = [[int(s) if float(s).is_integer() else s, v] for s, v in zip(steps, values)]
    curves["plots"].update(plots)
    # one metric a line: the file stays small and its diffs readable
    metric_lines = ",\n".join(f"  {json.dumps(name)}: {json.dumps(points)}"
                              for name, points in curves["metrics"].items())
    (Path(run_dir) / CURVES_FILE).write_text(
        f'{{"plots": {json.dumps(curves["plots"])},\n "metrics": {{\n{metric_lines}\n}}}}\n')
    return curves


def read_curve(run_dir: str | Path, metric: str) -> tuple[list[float], list[float]]:
    """One metric as ``(steps, values)``: from the run's CSV log, or else from its ``curves.json`` (what a results copy
    keeps); empty lists if neither has it."""
    steps, values = read_scalars(run_dir, metric)
    if steps:
        return steps, values
    points = read_curves(run_dir)["metrics"].get(metric, [])
    return [float(p[0]) for p in points], [float(p[1]) for p in points]


def plot_curves(run_dir: str | Path, series: dict[str, str], *, title: str, xlabel: str = "frames",
                out_name: str = "curves.png", smooth: int = 20) -> Path | None:
    """Plot each ``label -> metric`` of the run's CSV log (raw and a moving average) into ``run_dir/out_name`` and
    record the points in ``curves.json``; None if nothing was logged."""
    logged = {metric: read_scalars(run_dir, metric) for metric in series.values()}
    logged = {metric: points for metric, points in logged.items() if points[0]}
    if not logged:
        return None
    spec = {"kind": "curves", "title": title, "xlabel": xlabel, "series": series, "smooth": smooth}
    return draw_curves(record_curves(run_dir, logged, {out_name: spec}), spec, Path(run_dir) / out_name)


def draw_curves(curves: dict, spec: dict, out: Path) -> Path | None:
    """Draw a ``curves`` spec (label -> metric of ``curves["metrics"]``, raw and a moving average) into ``out``."""
    import numpy as np

    plt = _pyplot()
    smooth = spec["smooth"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for label, metric in spec["series"].items():
        points = curves["metrics"].get(metric)
        if not points:
            continue
        drawn = True
        steps, values = [p[0] for p in points], [p[1] for p in points]
        line, = ax.plot(steps, values, alpha=0.3 if len(values) > smooth else 1.0, marker="" if len(values) > 1 else "o")
        if len(values) > smooth:
            kernel = np.ones(smooth) / smooth
            ax.plot(steps[smooth - 1:], np.convolve(values, kernel, mode="valid"), color=line.get_color(),
                    label=f"{label} (mean of {smooth})")
        else:
            line.set_label(label)
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(spec["xlabel"])
    ax.set_ylabel("episode return")
    ax.set_title(spec["title"])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, out, dpi=100)


def evaluations(run_dir: str | Path) -> list[dict]:
    """One row per greedy evaluation of a run: env steps, minutes of wall time at that step, return."""
    import numpy as np

    steps, returns = read_curve(run_dir, "eval/return")
    clock_steps, elapsed = read_curve(run_dir, "time/elapsed_s")
    minutes = np.interp(steps, clock_steps, elapsed) / 60 if clock_steps else [float("nan")] * len(steps)
    return [{"env_steps": int(s), "minutes": round(float(m), 1), "eval_return": float(r)}
            for s, m, r in zip(steps, minutes, returns)]


def plot_eval_curve(run_dirs: list[Path], goal: float, out_name: str = "eval_curve.png") -> Path:
    """Every run's greedy evaluations against env steps and against minutes, in ``run_dirs[0]/out_name``; records
    each run's points in its ``curves.json`` and the plot (the runs as paths from the first) in the first's."""
    for run_dir in run_dirs:
        metrics = {m: read_curve(run_dir, m) for m in ("eval/return", "time/elapsed_s")}
        if not metrics["eval/return"][0]:
            raise ConfigError(f"run {run_dir} has no eval/return (no CSV log, no {CURVES_FILE}); allowed: a run "
                              "directory of offpolicy.train or its results copy")
        record_curves(run_dir, metrics, {})
    spec = {"kind": "eval_curve", "goal": goal, "runs": [os.path.relpath(r, run_dirs[0]) for r in run_dirs]}
    record_curves(run_dirs[0], {}, {out_name: spec})
    return draw_eval_curve(spec, run_dirs[0] / out_name, run_dirs[0])


def draw_eval_curve(spec: dict, out: Path, run_dir: Path) -> Path:
    """Draw an ``eval_curve`` spec: two panels (agent steps, wall-clock minutes), one line per run (the spec's paths,
    from ``run_dir``), the goal dashed."""
    plt = _pyplot()
    fig, (by_steps, by_minutes) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for relative in spec["runs"]:
        run = (Path(run_dir) / relative).resolve()
        rows = evaluations(run)
        if not rows:
            plt.close(fig)
            raise ConfigError(f"{Path(run_dir) / CURVES_FILE}: plots.{out.name} draws run {run}, which has no "
                              f"eval/return (no CSV log, no {CURVES_FILE})")
        by_steps.plot([r["env_steps"] / 1e6 for r in rows], [r["eval_return"] for r in rows], marker="o",
                      label=run.name)
        by_minutes.plot([r["minutes"] for r in rows], [r["eval_return"] for r in rows], marker="o", label=run.name)
    for ax, label in ((by_steps, "agent steps (millions)"), (by_minutes, "wall-clock minutes")):
        ax.axhline(spec["goal"], color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    by_steps.set_ylabel("greedy evaluation return (whole games)")
    by_minutes.legend()
    fig.tight_layout()
    return _save(fig, out, dpi=100)


def redraw(curves: dict, out_dir: Path, run_dir: Path, source: str) -> list[Path]:
    """Draw every plot of a run's ``curves.json`` content (read from ``source``, named in errors) into ``out_dir``
    (an eval_curve finds its other runs from ``run_dir``); the PNGs written."""
    check_curves(curves, source)
    written = []
    for name, spec in curves["plots"].items():
        out = Path(out_dir) / name
        drawn = draw_curves(curves, spec, out) if spec["kind"] == "curves" else draw_eval_curve(spec, out, run_dir)
        if drawn is not None:
            written.append(drawn)
    return written


def draw_seeds(title: str, runs: list[dict], target: float | None, budget: int, out: Path) -> Path:
    """Every seed's evaluation return against env steps (``runs``: offpolicy_learning records, each with ``seed`` and
    ``eval_returns`` pairs), with the target, in ``out``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in runs:
        env_steps, returns = zip(*r["eval_returns"]) if r["eval_returns"] else ((), ())
        ax.plot(env_steps, returns, marker=".", label=f"seed {r['seed']}")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g} within {budget:,} env steps")
    ax.set_xlabel("collected env steps")
    ax.set_ylabel("evaluation return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out, dpi=90)


def _save(fig, out: Path, dpi: int) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    _pyplot().close(fig)
    return out
