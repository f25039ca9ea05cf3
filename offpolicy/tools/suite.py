"""``python -m offpolicy.tools.suite profile=<name> [algos=NAME,NAME...] [suite_dir=PATH] [timeout_s=N] [key=value ...]``:
run ``python -m offpolicy.train`` once per algorithm, each in a fresh process (so its Ray cluster and every resource
are gone before the next starts), record every failure instead of stopping at the first, and write
``<suite_dir>/suite.json``. Other ``key=value`` pairs go to every run. Exit 0 only when every run completed.

Each algorithm runs on its own default env unless ``env=`` is given (its yaml's; the ``*_smoke`` profiles use its
module's ``smoke_env``, to stay in seconds).
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

from offpolicy.algos import ALGOS, algorithm
from offpolicy.config import compose_config
from shared.config import ConfigError, ensure_writable_dir, run_cli

SUITE_KEYS = ("algos", "suite_dir", "timeout_s")
SET_BY_THE_SUITE = ("algo", "run_dir", "resume")


def _parse(argv: list[str]) -> tuple[dict, list[str]]:
    own, rest = {}, []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ConfigError(f"argument {arg!r} is not of the form key=value")
        (own.__setitem__(key, value) if key in SUITE_KEYS else rest.append(arg))
    if not any(a.startswith("profile=") for a in rest):
        raise ConfigError("profile is required; allowed: profile=<a file in configs/offpolicy/profile/>")
    algos = own.get("algos", ",".join(ALGOS)).split(",")
    bad = [a for a in algos if a not in ALGOS]
    if bad:
        raise ConfigError(f"algos={own['algos']!r} is not allowed; allowed: a comma-separated subset of {','.join(ALGOS)}")
    timeout = own.get("timeout_s", "3600")
    if not timeout.isdigit() or int(timeout) < 1:
        raise ConfigError(f"timeout_s={timeout!r} is not allowed; allowed: a positive integer (seconds per run)")
    taken = [a for a in rest if a.partition("=")[0] in SET_BY_THE_SUITE]
    if taken:
        raise ConfigError(f"{taken[0]!r} is not allowed in a suite (it sets algo and run_dir of each run); allowed: "
                          "algos=NAME,NAME... and suite_dir=PATH")
    own["algos"], own["timeout_s"] = algos, int(timeout)
    return own, rest


def _smoke_env(algo: str, overrides: list[str]) -> list[str]:
    """``env=`` of the algorithm's smoke env for a ``*smoke`` profile without an env of its own; else nothing."""
    profile = next(a.partition("=")[2] for a in overrides if a.startswith("profile="))
    if profile.endswith("smoke") and not any(a.startswith(("env=", "env.name=")) for a in overrides):
        return [f"env={algorithm(algo).smoke_env}"]
    return []


def run_one(algo: str, run_dir: Path, overrides: list[str], timeout_s: int) -> dict:
    """One training run in a fresh interpreter; its exit code, wall time, summary (if written) and last error line."""
    args = [f"algo={algo}", f"run_dir={run_dir}", *overrides, *_smoke_env(algo, overrides)]
    start = time.monotonic()
    log = run_dir.parent / f"{algo}.log"
    with open(log, "w") as out:
        try:
            code = subprocess.run([sys.executable, "-m", "offpolicy.train", *args], stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = None
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    errors = [line for line in log.read_text().splitlines() if line.startswith(("error:", "Traceback"))]
    error = None
    if code is None:
        error = f"timed out after {timeout_s} s"
    elif code != 0:
        error = errors[-1] if errors else f"exit code {code}"
    return {"algo": algo, "args": args, "exit_code": code, "ok": code == 0, "error": error,
            "wall_s": round(time.monotonic() - start, 1), "log": str(log), "summary": summary}


def main(argv: list[str]) -> int:
    """CLI: run the suite, print one JSON line per run and the suite's summary path."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(__doc__)
        return 0
    own, overrides = _parse(argv)
    for algo in own["algos"]:  # a bad key or value: one error line now, before any run starts
        compose_config([f"algo={algo}", *overrides, *_smoke_env(algo, overrides)])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    suite_dir = Path(own.get("suite_dir") or f"runs/suite-{stamp}")
    ensure_writable_dir(suite_dir, "suite_dir")
    runs = []
    for algo in own["algos"]:
        result = run_one(algo, suite_dir / algo, overrides, own["timeout_s"])
        runs.append(result)
        print(json.dumps({k: result[k] for k in ("algo", "ok", "exit_code", "error", "wall_s")}), flush=True)
    report = {"overrides": overrides, "runs": runs, "passed": sum(r["ok"] for r in runs),
              "failed": [r["algo"] for r in runs if not r["ok"]]}
    (suite_dir / "suite.json").write_text(json.dumps(report, indent=2))
    print(f"suite: {report['passed']}/{len(runs)} runs completed; {suite_dir / 'suite.json'}")
    return 0 if not report["failed"] else 1


if __name__ == "__main__":
    run_cli(main)
