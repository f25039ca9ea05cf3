"""benchmarks/results keeps small files, not a run's CSV logs: the curves a run draws are recorded in its curves.json
(offpolicy_learning: in its record), benchmarks/plot_results.py redraws the committed PNGs from them, and
.gitignore keeps raw run output out of git."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import yaml

from shared.plots import plot_curves, read_curve

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def plot_results(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "benchmarks/plot_results.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def assert_png(path: Path) -> None:
    """A valid PNG with something drawn in it (empty axes of this size are ~8 kB, these curves 30-90 kB)."""
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 20_000


def assert_same_picture(drawn: Path, committed: Path) -> None:
    """A valid, non-trivial PNG that shows what the committed one shows (antialiasing may move a pixel or two)."""
    assert_png(drawn)
    new, old = mpimg.imread(drawn), mpimg.imread(committed)
    assert new.shape == old.shape
    assert (np.abs(new - old).max(axis=-1) > 0.1).mean() < 1e-3


def logged_run(run_dir: Path) -> Path:
    """A run directory with a CSV log as make_logger writes it (written directly: importing torchrl costs seconds)."""
    for name, rows in {"train/return": "100,-20.0\n200,-18.5\n300,-15.0\n", "eval/return": "250,-19.0\n",
                       "time/elapsed_s": "250,12.5\n"}.items():
        path = run_dir / "logs" / "scalars" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rows)
    return run_dir


def test_plot_curves_records_the_points_it_draws_and_they_outlive_the_csv_log(tmp_path):
    run_dir = logged_run(tmp_path / "run")
    png = plot_curves(run_dir, {"train": "train/return", "eval": "eval/return"}, title="T", xlabel="steps")
    curves = json.loads((run_dir / "curves.json").read_text())
    assert curves["metrics"] == {"train/return": [[100, -20.0], [200, -18.5], [300, -15.0]],
                                 "eval/return": [[250, -19.0]]}  # exactly the plotted series, nothing else
    assert curves["plots"] == {"curves.png": {"kind": "curves", "title": "T", "xlabel": "steps", "smooth": 20,
                                              "series": {"train": "train/return", "eval": "eval/return"}}}
    shutil.rmtree(run_dir / "logs")  # what benchmarks/results keeps: no CSV log
    assert read_curve(run_dir, "eval/return") == ([250.0], [-19.0])
    assert read_curve(run_dir, "eval/missing") == ([], [])
    out = tmp_path / "out"
    done = plot_results(f"results={tmp_path}", f"out={out}")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"plot": str(out / "run" / "curves.png"), "from": str(run_dir / "curves.json")}]
    assert_same_picture(out / "run" / "curves.png", png)


def test_committed_results_are_redrawn_from_their_kept_files(tmp_path):
    """An A3C run's curves.json, a case's three seeds in its offpolicy_learning records and an older single-run record
    redraw the PNGs committed beside them (the records' run directories are not in git: their curves.png are drawn
    anew)."""
    (tmp_path / "a3c_pong").mkdir()
    shutil.copy(RESULTS / "a3c_pong" / "curves.json", tmp_path / "a3c_pong")
    (tmp_path / "offpolicy_learning").mkdir()
    for name in ("redq-pendulum.jsonl", "td3-halfcheetah.json"):
        shutil.copy(RESULTS / "offpolicy_learning" / name, tmp_path / "offpolicy_learning")
    done = plot_results(f"results={tmp_path}")
    assert done.returncode == 0, done.stderr
    drawn = {Path(json.loads(line)["plot"]).relative_to(tmp_path).as_posix() for line in done.stdout.splitlines()}
    committed = {"a3c_pong/curves.png", "offpolicy_learning/redq-pendulum-seeds.png",
                 "offpolicy_learning/td3-halfcheetah/curves.png"}
    assert drawn == {*committed, *(f"offpolicy_learning/redq-pendulum-seed{seed}/curves.png" for seed in range(3))}
    for png in committed:
        assert_same_picture(tmp_path / png, RESULTS / png)
    for seed in range(3):
        assert_png(tmp_path / f"offpolicy_learning/redq-pendulum-seed{seed}/curves.png")


# runs recorded by an earlier offpolicy_learning.py, as <case>.json without a seed; the current one writes <case>.jsonl
SINGLE_RUN_RECORDS = {"ddpg-pendulum-options.json", "sac-halfcheetah.json", "td3-halfcheetah.json"}
# recorded before a record kept its run's curves
WITHOUT_CURVES = {"redq-pendulum-newloss"}


def test_learning_records_are_one_jsonl_per_case_with_one_line_per_seed():
    learning = RESULTS / "offpolicy_learning"
    cases = sorted(learning.glob("*.jsonl"))
    assert cases
    for path in cases:
        runs = [json.loads(line) for line in path.read_text().splitlines()]
        assert runs and all(isinstance(run, dict) for run in runs), path.name
        needs = {"seed", "case", "eval_returns", "target", "budget_env_steps", "summary", "config",
                 *(() if path.stem in WITHOUT_CURVES else ("curves",))}
        for number, run in enumerate(runs, start=1):
            assert needs <= run.keys(), f"{path.name}:{number} lacks {sorted(needs - run.keys())}"
        seeds = [run["seed"] for run in runs]
        assert len(set(seeds)) == len(seeds), f"{path.name} holds a seed twice: {seeds}"
    assert {p.name for p in learning.glob("*.json")} == SINGLE_RUN_RECORDS  # no per-seed <case>-seed<N>.json
    assert {p.name.removesuffix("-seeds.png") for p in learning.glob("*-seeds.png")} <= {p.stem for p in cases}


@pytest.mark.parametrize("content, message", [
    ("{not json", "curves.json is not JSON"),
    ('{"metrics": {"eval/return": [[1, 2, 3]]}, "plots": {}}', "metrics.eval/return is not a list of [step, value]"),
    ('{"metrics": {}, "plots": {"curves.png": {"kind": "bars"}}}', "kind is 'bars'; allowed: curves, eval_curve"),
    ('{"metrics": {}, "plots": {"curves.png": {"kind": "curves", "title": "T"}}}',
     "plots.curves.png lacks xlabel, series, smooth"),
])
def test_a_malformed_curves_file_is_one_error_line(tmp_path, content, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "curves.json").write_text(content)
    done = plot_results(f"results={tmp_path}", f"out={tmp_path / 'out'}")
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_missing_or_empty_results_and_bad_records_are_one_error_line(tmp_path):
    done = plot_results(f"results={tmp_path / 'nowhere'}")
    assert done.returncode == 2 and "is not a directory" in done.stderr
    done = plot_results(f"results={tmp_path}")
    assert done.returncode == 2 and "holds no curves.json and no offpolicy_learning/*.jsonl record" in done.stderr
    (tmp_path / "offpolicy_learning").mkdir()
    records = tmp_path / "offpolicy_learning" / "sac-pendulum.jsonl"
    records.write_text('{"case": "sac-pendulum", "seed": 0}\n')
    done = plot_results(f"results={tmp_path}")
    assert done.returncode == 2 and "sac-pendulum.jsonl:1 lacks eval_returns, target, budget_env_steps" in done.stderr
    records.write_text("\n")
    done = plot_results(f"results={tmp_path}")
    assert done.returncode == 2 and "sac-pendulum.jsonl holds no record" in done.stderr
    records.write_text('{"case": "sac-pendulum", "seed": 0,\n')
    done = plot_results(f"results={tmp_path}")
    assert done.returncode == 2 and "sac-pendulum.jsonl:1 is not JSON" in done.stderr
    done = plot_results("colour=red")
    assert done.returncode == 2 and "allowed: results=DIR, out=DIR" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_learning_record_carries_the_runs_config_and_curves(tmp_path, monkeypatch):
    """offpolicy_learning.py's record of a finished run holds what its (git-ignored) run directory drew from, as the
    line of its seed in its case's records."""
    spec = importlib.util.spec_from_file_location("offpolicy_learning", REPO / "benchmarks" / "offpolicy_learning.py")
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    monkeypatch.setattr(learning, "RESULTS", tmp_path)
    run_dir = logged_run(tmp_path / "sac-pendulum-seed0")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"algo": "sac", "seed": 0}))
    plot_curves(run_dir, {"train": "train/return", "eval": "eval/return"}, title="SAC", xlabel="steps")
    record = learning.finish_case("sac-pendulum", 0, subprocess.Popen(["true"]), run_dir, time.time(), "0123abc")
    assert record["commit"] == "0123abc"  # the code at the run's start, not at its end
    assert record["config"] == {"algo": "sac", "seed": 0}
    assert record["curves"] == json.loads((run_dir / "curves.json").read_text())
    assert record["seed"] == 0
    assert [json.loads(line) for line in (tmp_path / "sac-pendulum.jsonl").read_text().splitlines()] == [record]
    assert learning.records("sac-pendulum") == {0: record}


def test_gitignore_keeps_run_output_out_and_summaries_in():
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True, text=True)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout")
    raw = ["benchmarks/results/a3c_pong/logs/scalars/train/return.csv", "benchmarks/results/a3c_pong/logs/owner.json",
           "benchmarks/results/a3c_pong/scalars/eval/return.csv", "benchmarks/results/a3c_pong/checkpoints/last.pt",
           "benchmarks/results/a3c_pong/videos/evaluate_1.mp4", "benchmarks/results/a3c_pong/pids.json",
           "benchmarks/results/offpolicy_atari/dqn-pong/replay/storage.memmap",
           "benchmarks/results/offpolicy_learning/sac-pendulum-seed0/summary.json",
           "benchmarks/results/offpolicy_learning/sac-pendulum-seed0/curves.png",
           "benchmarks/results/offpolicy_learning/sac-pendulum.jsonl.lock"]
    kept = ["benchmarks/results/a3c_pong/summary.json", "benchmarks/results/a3c_pong/config.yaml",
            "benchmarks/results/a3c_pong/curves.json", "benchmarks/results/a3c_pong/curves.png",
            "benchmarks/results/a3c_pong/evaluation.json", "benchmarks/results/offpolicy_atari/dqn-pong/train_log.txt",
            "benchmarks/results/offpolicy_learning/sac-pendulum.jsonl",
            "benchmarks/results/offpolicy_learning/sac-pendulum-seeds.png", "benchmarks/results/plan_vs_run.jsonl"]
    # --no-index: judge the rules themselves, also for paths git already tracks
    done = subprocess.run(["git", "check-ignore", "--no-index", *raw, *kept], cwd=REPO, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    assert sorted(done.stdout.split()) == sorted(raw)
