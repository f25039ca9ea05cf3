"""``python -m offpolicy.tools.report RUN_DIR... [budget=N] [references=CSV] [out=DIR]``: how a set of runs learned,
the way papers report it. The runs' deterministic evaluations (``eval/return``, from a run's CSV log or the
``curves.json`` a results copy keeps) are grouped by (algorithm, env); for each group it prints and writes the number
of runs, the mean and the interquartile mean (IQM) of the returns at the budget (the last evaluation at or before
``budget`` env steps; with no budget, each run's last evaluation) with stratified bootstrap 95 % confidence intervals
(``scipy.stats.bootstrap``), the mean final return, and, given reference values (a CSV such as
benchmarks/references/mujoco_300k.csv), the published mean and SD, whether the mean lies within one SD of it or above,
and the score normalised by the published mean, also aggregated over every group that has one (IQM, each group's runs
resampled on their own: the stratified bootstrap of Agarwal et al. 2021). Plots: one PNG per group (each run's curve,
the mean over runs, the reference at its budget) and the normalised scores. ``RUN_DIR`` is a run directory or a
directory of run directories.

Why scipy, not rliable: rliable (IQM and stratified bootstrap intervals) was archived in 2025; scipy's bootstrap takes
several samples and resamples each on its own, which is the stratified bootstrap.
"""
from __future__ import annotations

import csv
import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from shared.config import ConfigError, ensure_writable_dir, run_cli
from shared.files import atomic_write_text
from shared.plots import read_curve

OPTIONS = ("budget", "references", "out", "confidence", "resamples", "seed")
USAGE = ("usage: python -m offpolicy.tools.report RUN_DIR [RUN_DIR ...] [budget=ENV_STEPS] [references=CSV] "
         "[out=DIR] [confidence=0.95] [resamples=10000] [seed=0]")


@dataclass
class RunCurve:
    """One run's evaluations: ``steps`` (env steps) and ``returns`` (mean return of each evaluation)."""

    path: Path
    algo: str
    env: str
    seed: int
    steps: list[float]
    returns: list[float]

    def at(self, budget: int | None) -> float | None:
        """The return at ``budget`` env steps: the last evaluation at or before it, if the run's evaluations reach
        it (None if they stop short); with no budget, the last evaluation."""
        if budget is None:
            return self.returns[-1]
        if self.steps[-1] < budget:
            return None
        return [r for s, r in zip(self.steps, self.returns) if s <= budget][-1]


def find_runs(paths: list[str]) -> list[Path]:
    """The run directories named by ``paths``: a directory with a ``config.yaml``, or each such directory directly
    inside one; a ConfigError for a path that is neither."""
    runs = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ConfigError(f"{raw!r} is not a directory; allowed: a run directory or a directory of runs")
        if (path / "config.yaml").is_file():
            runs.append(path)
            continue
        inside = sorted(p for p in path.iterdir() if (p / "config.yaml").is_file())
        if not inside:
            raise ConfigError(f"{raw!r} holds no run (no config.yaml in it or in its subdirectories); allowed: a run "
                              "directory or a directory of runs")
        runs += inside
    return runs


def read_run(path: Path) -> RunCurve:
    """A run's algorithm, env, seed and evaluations; a ConfigError (one line) for a directory that is not an
    evaluated off-policy run."""
    cfg = OmegaConf.load(path / "config.yaml")  # omegaconf reads YAML with yaml.SafeLoader
    algo, env, seed = cfg.get("algo"), OmegaConf.select(cfg, "env.name"), cfg.get("seed")
    if not isinstance(algo, str) or not isinstance(env, str):
        raise ConfigError(f"{path}/config.yaml names no algo and env.name; allowed: an off-policy run's config")
    steps, returns = read_curve(path, "eval/return")
    if not steps:
        raise ConfigError(f"{path} has no evaluations (eval/return in logs/ or curves.json); allowed: a run with "
                          "eval.interval_env_steps > 0 or a final evaluation")
    order = np.argsort(steps, kind="stable")
    return RunCurve(path, algo, env, int(seed or 0), [steps[i] for i in order], [returns[i] for i in order])


def read_references(path: Path) -> dict[tuple[str, str], dict]:
    """``(algo, env family) -> {"env_steps", "mean", "sd", "seeds", "version", "source"}`` from a CSV with those
    columns (``#`` lines are comments); the env family is the name before ``-v`` (HalfCheetah-v5 -> HalfCheetah)."""
    if not path.is_file():
        raise ConfigError(f"references={str(path)!r} does not exist; allowed: a CSV like "
                          "benchmarks/references/mujoco_300k.csv")
    lines = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    need = {"algo", "env", "env_steps", "mean", "sd"}
    if not rows or not need <= set(rows[0]):
        raise ConfigError(f"references={str(path)!r} lacks the columns {sorted(need)}; allowed: a CSV like "
                          "benchmarks/references/mujoco_300k.csv")
    table = {}
    for i, row in enumerate(rows, start=2):
        try:
            table[(row["algo"], row["env"])] = {"env_steps": int(row["env_steps"]), "mean": float(row["mean"]),
                                                "sd": float(row["sd"]), "seeds": row.get("seeds"),
                                                "version": row.get("version"), "source": row.get("source")}
        except (TypeError, ValueError):
            raise ConfigError(f"references={str(path)!r} row {i} ({','.join(map(str, row.values()))}) is not "
                              "numbers where env_steps, mean and sd are") from None
    return table


def env_family(env: str) -> str:
    return env.split("-v")[0].split("/")[-1]


def iqm(values) -> float:
    """The interquartile mean: the mean of the middle 50 % (scipy's 25 % trimmed mean)."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(values, dtype=float), 0.25))


def interval(samples: list[np.ndarray], statistic, *, confidence: float, resamples: int, seed: int):
    """The ``confidence`` percentile bootstrap interval of ``statistic`` over the concatenated samples, each sample
    resampled on its own (stratified); None when a sample has fewer than two values."""
    from scipy.stats import bootstrap

    if any(len(s) < 2 for s in samples):
        return None
    result = bootstrap(tuple(samples), lambda *xs: statistic(np.concatenate(xs)), vectorized=False, paired=False,
                       confidence_level=confidence, n_resamples=resamples, method="percentile",
                       random_state=np.random.default_rng(seed))
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def summarise(runs: list[RunCurve], budget: int | None, references: dict, *, confidence: float, resamples: int,
              seed: int) -> tuple[list[dict], dict | None]:
    """One record per (algorithm, env) group, and the aggregate of the normalised scores (None without any)."""
    groups: dict[tuple[str, str], list[RunCurve]] = {}
    for run in runs:
        groups.setdefault((run.algo, run.env), []).append(run)
    records, normalised = [], []
    for (algo, env), members in sorted(groups.items()):
        reference = references.get((algo, env_family(env)))
        at = budget if budget is not None else (reference["env_steps"] if reference else None)
        values = np.array([v for v in (r.at(at) for r in members) if v is not None])
        record = {"algo": algo, "env": env, "runs": len(members), "seeds": sorted(r.seed for r in members),
                  "budget_env_steps": at, "runs_at_budget": len(values),
                  "final_mean": float(np.mean([r.returns[-1] for r in members])),
                  "final_env_steps": [r.steps[-1] for r in members]}
        if len(values):
            stats = {"mean": np.mean, "iqm": iqm}
            for name, fn in stats.items():
                record[name] = float(fn(values))
                record[f"{name}_ci"] = interval([values], fn, confidence=confidence, resamples=resamples, seed=seed)
            record["returns"] = values.tolist()
        if reference is not None:
            record["reference"] = reference
            if len(values):
                scores = values / reference["mean"]
                normalised.append(scores)
                record["normalised_mean"] = float(scores.mean())
                record["normalised_mean_ci"] = interval([scores], np.mean, confidence=confidence,
                                                        resamples=resamples, seed=seed)
                record["within_one_sd_or_above"] = bool(record["mean"] >= reference["mean"] - reference["sd"])
        records.append(record)
    aggregate = None
    if normalised:
        aggregate = {"groups": len(normalised), "runs": int(sum(len(s) for s in normalised)),
                     "normalised_iqm": iqm(np.concatenate(normalised)),
                     "normalised_iqm_ci": interval(normalised, iqm, confidence=confidence, resamples=resamples,
                                                   seed=seed),
                     "normalised_mean": float(np.concatenate(normalised).mean()),
                     "normalised_mean_ci": interval(normalised, np.mean, confidence=confidence,
                                                    resamples=resamples, seed=seed)}
    return records, aggregate


def plot_group(record: dict, members: list[RunCurve], out: Path) -> Path:
    """Each run's evaluation curve, their mean where every run has evaluated, and the reference at its budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in members:
        ax.plot(run.steps, run.returns, lw=0.8, alpha=0.5, label=f"seed {run.seed}")
    common = sorted(set.intersection(*(set(r.steps) for r in members)))
    if common:
        mean = [np.mean([r.returns[r.steps.index(s)] for r in members]) for s in common]
        ax.plot(common, mean, lw=2.2, color="black", label=f"mean of {len(members)}")
    reference = record.get("reference")
    if reference is not None:
        ax.errorbar([reference["env_steps"]], [reference["mean"]], yerr=[reference["sd"]], fmt="s", color="tab:red",
                    capsize=4, label=f"published ({reference['version']}) mean ± SD")
    ax.set(title=f"{record['algo'].upper()} on {record['env']}", xlabel="collected env steps",
           ylabel="evaluation return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_normalised(records: list[dict], aggregate: dict, out: Path) -> Path:
    """Each group's mean normalised score with its interval, and the aggregate IQM."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if "normalised_mean" in r]
    labels = [f"{r['algo']} {env_family(r['env'])}" for r in rows] + ["IQM (all)"]
    centres = [r["normalised_mean"] for r in rows] + [aggregate["normalised_iqm"]]
    cis = [r["normalised_mean_ci"] for r in rows] + [aggregate["normalised_iqm_ci"]]
    low = [c - (ci[0] if ci else c) for c, ci in zip(centres, cis)]
    high = [(ci[1] if ci else c) - c for c, ci in zip(centres, cis)]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1.2))
    ax.errorbar(centres, range(len(labels)), xerr=[low, high], fmt="o", capsize=3)
    ax.axvline(1.0, color="tab:red", lw=1, label="published mean")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="return ÷ published mean at the same budget")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _fmt(value, ci=None) -> str:
    if value is None:
        return "-"
    text = f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3f}"
    return text + (f" [{ci[0]:,.1f}, {ci[1]:,.1f}]" if ci and abs(value) >= 10 else
                   f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def group_line(record: dict) -> str:
    """One group's line: runs, mean and IQM at the budget with their intervals, final mean, the published value."""
    at = record["budget_env_steps"]
    line = (f"{record['algo']:>7} {record['env']:<16} runs {record['runs']} (at budget {record['runs_at_budget']}) "
            f"at {f'{at:,} env steps' if at else 'the last evaluation'}: mean "
            f"{_fmt(record.get('mean'), record.get('mean_ci'))}, IQM {_fmt(record.get('iqm'), record.get('iqm_ci'))}, "
            f"final {_fmt(record['final_mean'])}")
    reference = record.get("reference")
    if reference is None:
        return line
    line += (f"; published {reference['mean']:,.0f} ± {reference['sd']:,.0f} ({reference['version']}): normalised "
             f"{_fmt(record.get('normalised_mean'), record.get('normalised_mean_ci'))}")
    if "within_one_sd_or_above" in record:
        line += (", within one SD or above" if record["within_one_sd_or_above"] else
                 ", below the published mean minus one SD")
    return line


def _parse(argv: list[str]) -> tuple[list[str], dict]:
    paths, options = [], {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            paths.append(arg)
        elif key in OPTIONS:
            options[key] = value
        else:
            raise ConfigError(f"unknown option {key!r}; allowed: {', '.join(OPTIONS)} (and run directories)")
    if not paths:
        raise ConfigError(f"no run directory given; {USAGE}")
    for key, low in (("budget", 1), ("resamples", 100), ("seed", 0)):
        if key in options and not (options[key].isdigit() and int(options[key]) >= low):
            raise ConfigError(f"{key}={options[key]!r} is not allowed; allowed: an integer >= {low}")
    if "confidence" in options:
        try:
            ok = 0 < float(options["confidence"]) < 1
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"confidence={options['confidence']!r} is not allowed; allowed: a number between 0 "
                              "and 1")
    return paths, options


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0
    paths, options = _parse(argv)
    runs = [read_run(path) for path in find_runs(paths)]
    references = read_references(Path(options["references"])) if "references" in options else {}
    budget = int(options["budget"]) if "budget" in options else None
    records, aggregate = summarise(runs, budget, references, confidence=float(options.get("confidence", 0.95)),
                                   resamples=int(options.get("resamples", 10000)), seed=int(options.get("seed", 0)))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = ensure_writable_dir(options.get("out", f"runs/report-{stamp}"), "out")
    for record in records:
        members = [r for r in runs if (r.algo, r.env) == (record["algo"], record["env"])]
        record["plot"] = str(plot_group(record, members, out / f"{record['algo']}-{env_family(record['env'])}.png"))
        print(group_line(record))
    if aggregate is not None:
        aggregate["plot"] = str(plot_normalised(records, aggregate, out / "normalised.png"))
        print(f"normalised over {aggregate['groups']} groups, {aggregate['runs']} runs: IQM "
              f"{_fmt(aggregate['normalised_iqm'], aggregate['normalised_iqm_ci'])}, mean "
              f"{_fmt(aggregate['normalised_mean'], aggregate['normalised_mean_ci'])}")
    report = {"groups": records, "normalised": aggregate, "budget_env_steps": budget,
              "confidence": float(options.get("confidence", 0.95)), "runs": [str(r.path) for r in runs]}
    atomic_write_text(out / "report.json", json.dumps(report, indent=2))
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    run_cli(main)
