"""``python -m offpolicy.tools.report``: on small synthetic runs whose returns come from a known distribution, the
statistics (mean, IQM, the bootstrap intervals, the at-budget and final returns, the scores normalised by published
values and their stratified aggregate), the files it writes, and every bad input as one line with exit 2."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from offpolicy.tools import report
from shared.config import run_cli

REFERENCES = report.Path(__file__).resolve().parent.parent / "benchmarks" / "references" / "mujoco_300k.csv"


def _run(root, name, *, algo="sac", env="HalfCheetah-v5", seed=0, returns=(), every=10_000, curves_json=False):
    """A run directory as offpolicy.train leaves it (config.yaml, the eval/return CSV log), or as a results copy
    keeps it (curves.json) with ``curves_json``; evaluations every ``every`` env steps."""
    path = root / name
    (path / "logs" / "scalars" / "eval").mkdir(parents=True)
    (path / "config.yaml").write_text(f"algo: {algo}\nenv:\n  name: {env}\nseed: {seed}\n")
    points = [[every * (i + 1), float(r)] for i, r in enumerate(returns)]
    if curves_json:
        (path / "curves.json").write_text(json.dumps({"metrics": {"eval/return": points}, "plots": {}}))
    else:
        (path / "logs" / "scalars" / "eval" / "return.csv").write_text(
            "".join(f"{s},{v}\n" for s, v in points))
    return path


def test_the_intervals_hold_a_known_distribution_s_mean(tmp_path):
    """30 seeds whose returns at 300k are drawn from N(1000, 100): the 95 % interval of the mean holds 1000 and is as
    wide as the normal theory's (2 x 1.96 x 100 / sqrt(30) = 71.6, within 30 %); the IQM is the mean of the middle
    16 of 30 (7 trimmed at each end); the final return is each run's last evaluation."""
    rng = np.random.default_rng(3)
    draws = rng.normal(1000, 100, 30)
    runs = [report.read_run(_run(tmp_path, f"s{i}", seed=i, returns=[0.0] * 29 + [d, d + 5]))
            for i, d in enumerate(draws)]
    [record], aggregate = report.summarise(runs, 300_000, {}, confidence=0.95, resamples=4000, seed=0)
    assert aggregate is None and record["runs"] == record["runs_at_budget"] == 30
    assert record["mean"] == pytest.approx(draws.mean())
    low, high = record["mean_ci"]
    assert low < 1000 < high and 0.7 * 71.6 < high - low < 1.3 * 71.6
    assert record["iqm"] == pytest.approx(np.sort(draws)[7:23].mean())
    assert record["iqm_ci"][0] < record["iqm"] < record["iqm_ci"][1]
    assert record["final_mean"] == pytest.approx(draws.mean() + 5) and record["final_env_steps"] == [310_000] * 30


def test_at_budget_is_the_last_evaluation_at_or_before_it_and_short_runs_are_left_out(tmp_path):
    full = report.read_run(_run(tmp_path, "full", seed=0, returns=[1, 2, 3, 4], every=100))  # 100..400
    short = report.read_run(_run(tmp_path, "short", seed=1, returns=[7, 8], every=100))  # stops at 200
    assert (full.at(350), full.at(400), full.at(None), short.at(350)) == (3, 4, 4, None)
    [record], _ = report.summarise([full, short], 350, {}, confidence=0.95, resamples=200, seed=0)
    assert (record["runs"], record["runs_at_budget"], record["returns"]) == (2, 1, [3.0])
    assert record["mean_ci"] is None  # one value: no interval


def test_scores_are_normalised_by_the_published_values_and_aggregated_stratified(tmp_path):
    """SAC HalfCheetah (published 8,593 ± 964) at 8,000 and 9,000: normalised (8000 + 9000) / 2 / 8593, within one
    SD; TD3 Hopper (1,583 ± 639) at 500 and 700: below it. The aggregate IQM resamples each group's runs on its own;
    a group with no published value (DQN CartPole) is reported without a score."""
    references = report.read_references(REFERENCES)
    assert references[("crossq", "Walker2d")] == {"env_steps": 300_000, "mean": 5941.0, "sd": 483.0, "seeds": "10",
                                                  "version": "v4", "source": "SimbaV2 results/baseline/crossq.csv"}
    runs = [report.read_run(_run(tmp_path, f"sac{i}", seed=i, returns=[0.0] * 29 + [r]))
            for i, r in enumerate((8000, 9000))]
    runs += [report.read_run(_run(tmp_path, f"td3{i}", algo="td3", env="Hopper-v5", seed=i, returns=[0.0] * 29 + [r]))
             for i, r in enumerate((500, 700))]
    runs.append(report.read_run(_run(tmp_path, "dqn", algo="dqn", env="CartPole-v1", returns=[500.0])))
    records, aggregate = report.summarise(runs, None, references, confidence=0.95, resamples=1000, seed=0)
    by = {(r["algo"], r["env"]): r for r in records}
    sac, td3, dqn = by[("sac", "HalfCheetah-v5")], by[("td3", "Hopper-v5")], by[("dqn", "CartPole-v1")]
    assert sac["budget_env_steps"] == 300_000 and sac["normalised_mean"] == pytest.approx(8500 / 8593)
    assert sac["within_one_sd_or_above"] and not td3["within_one_sd_or_above"]
    assert "reference" not in dqn and dqn["budget_env_steps"] is None and dqn["mean"] == 500
    scores = np.array([8000 / 8593, 9000 / 8593, 500 / 1583, 700 / 1583])
    assert (aggregate["groups"], aggregate["runs"]) == (2, 4)
    assert aggregate["normalised_mean"] == pytest.approx(scores.mean())
    low, high = aggregate["normalised_mean_ci"]
    # stratified: every resample keeps two runs of each group, so its mean stays between the groups' lowest and
    # highest pairs; an unstratified one drew three or four TD3 runs in 5 of 16 resamples (means near 0.4)
    assert (scores[0] + scores[2]) / 2 - 1e-9 <= low < scores.mean() < high <= (scores[1] + scores[3]) / 2 + 1e-9


def test_the_cli_prints_and_writes_the_report_and_plots(tmp_path, capsys):
    """A directory of runs (one a results copy with curves.json) in, one line per group, report.json and the PNGs
    out."""
    runs = tmp_path / "runs"
    for i, r in enumerate((8000, 9000, 10000)):
        _run(runs, f"sac-{i}", seed=i, returns=[100.0 * k for k in range(29)] + [r], curves_json=i == 2)
    out = tmp_path / "out"
    assert report.main([str(runs), f"references={REFERENCES}", f"out={out}", "resamples=500"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[:4] == ["sac", "HalfCheetah-v5", "runs", "3"]
    assert "published 8,593 ± 964 (v4): normalised" in printed[0] and "within one SD or above" in printed[0]
    assert printed[1].startswith("normalised over 1 groups, 3 runs: IQM ")
    written = json.loads((out / "report.json").read_text())
    [group] = written["groups"]
    assert group["returns"] == [8000.0, 9000.0, 10000.0] and group["seeds"] == [0, 1, 2]
    assert math.isclose(written["normalised"]["normalised_mean"], 9000 / 8593)
    for png in ("sac-HalfCheetah.png", "normalised.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, expected", [
    ([], "error: no run directory given; usage: python -m offpolicy.tools.report RUN_DIR"),
    (["{tmp}/nowhere"], "error: '{tmp}/nowhere' is not a directory; allowed: a run directory or a directory of runs"),
    (["{tmp}/empty"], "error: '{tmp}/empty' holds no run (no config.yaml in it or in its subdirectories)"),
    (["{tmp}/unevaluated"], "error: {tmp}/unevaluated has no evaluations (eval/return in logs/ or curves.json)"),
    (["{tmp}/good", "budget=0"], "error: budget='0' is not allowed; allowed: an integer >= 1"),
    (["{tmp}/good", "confidence=95"], "error: confidence='95' is not allowed; allowed: a number between 0 and 1"),
    (["{tmp}/good", "bins=3"], "error: unknown option 'bins'; allowed: budget, references, out, confidence"),
    (["{tmp}/good", "references={tmp}/bad.csv"], "error: references='{tmp}/bad.csv' lacks the columns"),
    (["{tmp}/good", "references={tmp}/nan.csv"], "error: references='{tmp}/nan.csv' row 2 (sac,HalfCheetah,300k"),
], ids=["nothing", "missing", "no-run", "no-evaluations", "budget", "confidence", "unknown", "columns", "numbers"])
def test_bad_input_is_one_error_line(tmp_path, capsys, args, expected):
    (tmp_path / "empty").mkdir()
    _run(tmp_path, "good", returns=[1.0, 2.0])
    (_run(tmp_path, "unevaluated", returns=[]) / "logs" / "scalars" / "eval" / "return.csv").unlink()
    (tmp_path / "bad.csv").write_text("algo,env,mean\nsac,HalfCheetah,1\n")
    (tmp_path / "nan.csv").write_text("algo,env,env_steps,mean,sd\nsac,HalfCheetah,300k,1,2\n")
    with pytest.raises(SystemExit) as exit_:
        run_cli(report.main, [a.format(tmp=tmp_path) for a in args])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and err.startswith(expected.format(tmp=tmp_path)), err
