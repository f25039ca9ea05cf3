"""Redraw the PNGs of benchmarks/results from the files git keeps there (the runs' CSV logs are not kept):

- every run directory's ``curves.json`` (its points and how each of its PNGs was drawn: curves.png, eval_curve.png);
- every offpolicy_learning records file: a case's ``<case>.jsonl`` (one run a line, each with its seed) redraws each
  run's ``<case>-seed<N>/curves.png`` from the line's ``curves`` and ``<case>-seeds.png`` from all its lines; an older
  single-run record ``<case>.json`` redraws ``<case>/curves.png``.

    python benchmarks/plot_results.py [results=benchmarks/results] [out=DIR]

Draws into the results tree itself, or into ``out`` at the same relative paths. Prints one JSON line per PNG written
(and per record that keeps no curves); a missing or malformed input is one ``error:`` line and exit code 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.config import ConfigError  # noqa: E402
from shared.files import read_jsonl  # noqa: E402
from shared.plots import CURVES_FILE, draw_seeds, read_curves, redraw  # noqa: E402

LEARNING_RECORDS = "offpolicy_learning"  # the directory of offpolicy_learning.py's records (*.jsonl, older *.json)
RECORD_KEYS = ("case", "eval_returns", "target")
SEED_RECORD_KEYS = (*RECORD_KEYS, "seed", "budget_env_steps")


def read_records(path: Path) -> list[tuple[Path, dict]]:
    """The runs of an offpolicy_learning records file as (run directory, record): every line of a ``<case>.jsonl``
    (its run directory ``<case>-seed<N>``), or the one record of a ``<case>.json`` (``<case>``); ConfigError if the
    file is not such a records file."""
    allowed = "allowed: the records of benchmarks/offpolicy_learning.py"
    jsonl = path.suffix == ".jsonl"
    try:
        records = read_jsonl(path) if jsonl else [json.loads(path.read_text())]
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc}); {allowed}") from None
    except ValueError as exc:  # read_jsonl's, naming the line
        raise ConfigError(f"{exc}; {allowed}") from None
    if not records:
        raise ConfigError(f"{path} holds no record; {allowed}")
    runs = []
    for number, record in enumerate(records, start=1):
        missing = [key for key in (SEED_RECORD_KEYS if jsonl else RECORD_KEYS)
                   if not isinstance(record, dict) or key not in record]
        if missing:
            raise ConfigError(f"{path}:{number} lacks {', '.join(missing)}; {allowed}")
        runs.append((path.with_name(f"{path.stem}-seed{record['seed']}") if jsonl else path.with_suffix(""), record))
    return runs


def plot_results(results: Path, out: Path):
    """Redraw every PNG the kept files under ``results`` describe into ``out`` (same relative paths); yields one line
    per PNG written or record without curves."""
    if not results.is_dir():
        raise ConfigError(f"results={results} is not a directory; allowed: a benchmarks/results tree")
    record_files = sorted(p for p in results.rglob(f"{LEARNING_RECORDS}/*.json*") if p.suffix in (".json", ".jsonl"))
    records = {path: read_records(path) for path in record_files}
    # a learning run's own directory (kept locally) holds a curves.json too: its record draws the same curves
    recorded_runs = {run_dir for runs in records.values() for run_dir, _ in runs}
    curves_files = [f for f in sorted(results.rglob(CURVES_FILE)) if f.parent not in recorded_runs]
    if not curves_files and not records:
        raise ConfigError(f"results={results} holds no {CURVES_FILE} and no {LEARNING_RECORDS}/*.jsonl record; "
                          "allowed: a benchmarks/results tree")
    for curves_file in curves_files:
        run_dir = curves_file.parent
        for png in redraw(read_curves(run_dir), out / run_dir.relative_to(results), run_dir, str(curves_file)):
            yield {"plot": str(png), "from": str(curves_file)}
    for path, runs in records.items():
        for run_dir, record in runs:
            if "curves" in record:
                for png in redraw(record["curves"], out / run_dir.relative_to(results), run_dir, f"{path} curves"):
                    yield {"plot": str(png), "from": str(path)}
            else:
                yield {"skipped": str(out / run_dir.relative_to(results) / "curves.png"), "from": str(path),
                       "why": "the record keeps no curves (its run's CSV log was never kept)"}
        if path.suffix == ".jsonl":
            seeds = sorted((record for _, record in runs), key=lambda record: record["seed"])
            png = draw_seeds(path.stem, seeds, seeds[0]["target"], seeds[0]["budget_env_steps"],
                             out / path.parent.relative_to(results) / f"{path.stem}-seeds.png")
            yield {"plot": str(png), "from": str(path)}


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
