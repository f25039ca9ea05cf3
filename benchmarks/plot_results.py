"""Redraw the PNGs of benchmarks/results from the files git keeps there (the runs' CSV logs are not kept):

- every run directory's ``curves.json`` (its points and how each of its PNGs was drawn: curves.png, eval_curve.png);
- every offpolicy_learning record ``<case>[-seed<N>].json``: its ``curves`` redraw ``<case>[-seed<N>]/curves.png``,
  and the records of one case's seeds ``<case>-seeds.png``.

    python benchmarks/plot_results.py [results=benchmarks/results] [out=DIR]

Draws into the results tree itself, or into ``out`` at the same relative paths. Prints one JSON line per PNG written
(and per record that keeps no curves); a missing or malformed input is one ``error:`` line and exit code 2.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.config import ConfigError  # noqa: E402
from shared.plots import CURVES_FILE, draw_seeds, read_curves, redraw  # noqa: E402

LEARNING_RECORDS = "offpolicy_learning"  # the directory whose *.json are offpolicy_learning.py's per-run records
SEED_RECORD = re.compile(r"(?P<case>.+)-seed(?P<seed>\d+)\.json")


def read_record(path: Path, needs: tuple[str, ...]) -> dict:
    """An offpolicy_learning record with the keys ``needs``; ConfigError if it is not one."""
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); allowed: a record of benchmarks/offpolicy_learning.py") \
            from None
    missing = [key for key in needs if not isinstance(record, dict) or key not in record]
    if missing:
        raise ConfigError(f"{path} lacks {', '.join(missing)}; allowed: a record of benchmarks/offpolicy_learning.py")
    return record


def plot_results(results: Path, out: Path):
    """Redraw every PNG the kept files under ``results`` describe into ``out`` (same relative paths); yields one line
    per PNG written or record without curves."""
    if not results.is_dir():
        raise ConfigError(f"results={results} is not a directory; allowed: a benchmarks/results tree")
    found = False
    for curves_file in sorted(results.rglob(CURVES_FILE)):
        found = True
        run_dir = curves_file.parent
        if run_dir.parent.name == LEARNING_RECORDS and (run_dir.parent / f"{run_dir.name}.json").exists():
            continue  # a learning run's own directory (kept locally): its record below draws the same curves
        for png in redraw(read_curves(run_dir), out / run_dir.relative_to(results), run_dir, str(curves_file)):
            yield {"plot": str(png), "from": str(curves_file)}
    seeds: dict[tuple[Path, str], list[tuple[int, Path, dict]]] = {}  # (directory, case) -> its seeds' records
    for path in sorted(results.rglob(f"{LEARNING_RECORDS}/*.json")):
        found = True
        seed = SEED_RECORD.fullmatch(path.name)
        record = read_record(path, ("case", "eval_returns", "target", *(("budget_env_steps",) if seed else ())))
        run_dir = path.with_suffix("")
        if "curves" in record:
            for png in redraw(record["curves"], out / run_dir.relative_to(results), run_dir, f"{path} curves"):
                yield {"plot": str(png), "from": str(path)}
        else:
            yield {"skipped": str(out / run_dir.relative_to(results) / "curves.png"), "from": str(path),
                   "why": "the record keeps no curves (its run's CSV log was never kept)"}
        if seed:
            seeds.setdefault((path.parent, seed["case"]), []).append((int(seed["seed"]), path, record))
    for (directory, case), runs in seeds.items():
        runs.sort(key=lambda run: run[0])
        records = [{**record, "seed": number} for number, _, record in runs]
        png = draw_seeds(case, records, records[0]["target"], records[0]["budget_env_steps"],
                         out / directory.relative_to(results) / f"{case}-seeds.png")
        yield {"plot": str(png), "from": [str(path) for _, path, _ in runs]}
    if not found:
        raise ConfigError(f"results={results} holds no {CURVES_FILE} and no {LEARNING_RECORDS}/*.json record; "
                          "allowed: a benchmarks/results tree")


def main(argv: list[str]) -> int:
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = [a for a in argv if "=" not in a or a.split("=", 1)[0] not in ("results", "out")]
    try:
        if unknown:
            raise ConfigError(f"unknown argument {unknown[0]!r}; allowed: results=DIR, out=DIR")
        results = Path(options.get("results", ROOT / "benchmarks" / "results"))
        for line in plot_results(results, Path(options.get("out", results))):
            print(json.dumps(line), flush=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
