"""A3C end to end, as subprocesses: the CI smoke run, resume, a killed worker, Ctrl-C, and the evaluate CLI."""
import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch

from proc import alive, run_module, start_module
from shared.logging import read_scalars

SMOKE = ("env=Pong", "workers=2", "profile=smoke")


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _wait_for(run_dir: Path, proc, metric: str, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(read_scalars(run_dir, metric)[0]) < count:
        assert proc.poll() is None, "run ended before the test could act on it"
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("a3c") / "smoke"
    return run_dir, run_module("a3c.train", *SMOKE, f"run_dir={run_dir}")


def test_smoke_run_trains_logs_from_worker_0_and_checkpoints(smoke_run):
    run_dir, result = smoke_run
    assert result.returncode == 0, result.stderr[-2000:]
    assert "leaked" not in result.stderr  # multiprocessing's resource tracker reports leaked semaphores / shm
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["frames"] >= 1280 and summary["updates"] >= 8
    assert summary["final_eval"] is not None and summary["final_eval"]["episodes"] == 1
    # the logger lives in worker 0's process only, and it wrote the metrics
    owners = json.loads((run_dir / "logs" / "owner.json").read_text())
    pids = json.loads((run_dir / "pids.json").read_text())
    assert owners == [{"pid": pids["worker_0"], "rank": 0}]
    steps, updates = read_scalars(run_dir, "a3c/updates")
    assert updates and updates[-1] == summary["updates"] and steps[-1] == summary["frames"]
    assert read_scalars(run_dir, "train/agent_steps_per_s")[1]
    # worker 0 logs its own losses; on a loaded machine worker 1 can take every frame while worker 0 starts up
    assert sum(summary["worker_updates"]) == summary["updates"] and len(summary["worker_updates"]) == 2
    assert bool(read_scalars(run_dir, "loss/critic")[1]) == (summary["worker_updates"][0] > 0)
    assert read_scalars(run_dir, "eval/final_return")[1] == [summary["final_eval"]["return"]]
    assert (run_dir / "config.yaml").read_text().count("name: Pong") == 1
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and summary["curves"]
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["counters"] == {k: summary[k] for k in ("frames", "updates", "episodes")}
    assert ckpt["config"]["workers"] == 2 and ckpt["num_actions"] == 6 and ckpt["format_version"] == 1
    assert _hogwild_steps_match(ckpt, summary["updates"])
    assert not alive(pids.values())


def _hogwild_steps_match(ckpt, updates: int, lost: int = 2) -> bool:
    """The shared optimizer's per-parameter step counts against the exact update count (SharedStats, locked per
    worker): equal, or short by at most ``lost``. Tolerant on purpose: the workers step the shared optimizer without a
    lock (Hogwild, as in the A3C paper), so two workers' simultaneous ``step += 1`` on one shared counter can lose an
    increment; a lock there would serialise every update of every worker."""
    steps = [float(s["step"]) for s in ckpt["optimizer"]["state"].values()]
    return all(updates - lost <= s <= updates for s in steps)


def test_resume_continues_counters_and_optimizer_state(smoke_run, tmp_path):
    run_dir, _ = smoke_run
    first = _summary(run_dir)
    resumed = tmp_path / "resumed"
    # no evaluator process and no final games: nothing here reads an evaluation, and on 2 cores a third process
    # slows the two workers
    result = run_module("a3c.train", f"resume={run_dir / 'checkpoints' / 'last.pt'}", "total_frames=2560",
                        "eval.interval_frames=0", "eval.final_episodes=0", f"run_dir={resumed}")
    assert result.returncode == 0, result.stderr[-2000:]
    second = _summary(resumed)
    assert second["frames"] >= 2560 and second["updates"] > first["updates"]
    assert second["frames"] - first["frames"] < 2560  # continued, not restarted from zero
    ckpt = torch.load(resumed / "checkpoints" / "last.pt", weights_only=True)
    assert _hogwild_steps_match(ckpt, second["updates"])
    assert ckpt["config"]["env"]["name"] == "Pong" and ckpt["config"]["profile"] == "smoke"


def test_a_checkpoint_without_a_format_version_reads_and_a_newer_one_is_exit_2(smoke_run, tmp_path, capsys):
    """A checkpoint without ``format_version`` (version 0: the layout of version 1) gives its model; one of a newer
    format (written by newer code) is one error line and exit 2 (the evaluate CLI's ``main`` under ``run_cli``, as
    ``python -m a3c.evaluate`` runs it; that path as a process is test_evaluate_cli_reports_mean_and_std...)."""
    from a3c.evaluate import main
    from a3c.model import checkpoint_model, read_checkpoint
    from shared.config import run_cli

    run_dir, _ = smoke_run
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    del ckpt["format_version"]
    torch.save(ckpt, tmp_path / "v0.pt")
    _, model = checkpoint_model(read_checkpoint(tmp_path / "v0.pt"))
    assert all(torch.equal(p, ckpt["model"][k]) for k, p in model.state_dict().items())
    torch.save({**ckpt, "format_version": 2}, tmp_path / "v2.pt")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_cli(main, [f"checkpoint={tmp_path / 'v2.pt'}", f"run_dir={tmp_path}"])
    stderr = capsys.readouterr().err
    err = stderr.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, stderr[-2000:]
    assert err[0].startswith(f"error: checkpoint='{tmp_path / 'v2.pt'}' has checkpoint format version 2"), err


def test_killed_worker_is_reported_and_restarted_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "kill"
    # enough frames that worker 1 still trains when the test kills it (~11,000 frames after its 3rd update)
    proc = start_module("a3c.train", *SMOKE, "total_frames=12000", "eval.interval_frames=0",
                        "eval.final_episodes=0", f"run_dir={run_dir}", log=tmp_path / "log")
    _wait_for(run_dir, proc, "a3c/updates", 3)
    victim = json.loads((run_dir / "pids.json").read_text())["worker_1"]
    os.kill(victim, signal.SIGKILL)
    assert proc.wait(timeout=240) == 0, (tmp_path / "log").read_text()[-2000:]
    summary = _summary(run_dir)
    assert summary["frames"] >= 12000 and summary["worker_restarts"] == 1
    assert summary["worker_deaths"][0]["rank"] == 1 and summary["worker_deaths"][0]["exitcode"] == -signal.SIGKILL
    assert summary["pids"]["worker_1"] != victim
    assert "worker 1 (pid" in (tmp_path / "log").read_text()


def test_worker_deaths_beyond_the_budget_fail_the_run_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "budget"
    proc = start_module("a3c.train", *SMOKE, "total_frames=10000000", "eval.interval_frames=0",
                        "supervision.max_restarts=0", f"run_dir={run_dir}", log=tmp_path / "log")
    _wait_for(run_dir, proc, "a3c/updates", 2)
    os.kill(json.loads((run_dir / "pids.json").read_text())["worker_1"], signal.SIGKILL)
    assert proc.wait(timeout=60) == 1
    summary = _summary(run_dir)
    assert summary["status"] == "failed" and "supervision.max_restarts=0" in summary["error"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["counters"]["frames"] > 0


def test_periodic_evaluation_is_logged_and_ctrl_c_stops_everything_within_10s(tmp_path):
    run_dir = tmp_path / "sigint"
    proc = start_module("a3c.train", *SMOKE, "total_frames=10000000", "eval.interval_frames=400",
                        "eval.max_episode_frames=400", f"run_dir={run_dir}", log=tmp_path / "log")
    try:
        _wait_for(run_dir, proc, "eval/return", 1)  # the background evaluator's result, logged by worker 0
        pids = json.loads((run_dir / "pids.json").read_text())
        # the children are forked from one fork server that imported their code once, not spawned by the main process
        (server,) = {psutil.Process(pid).ppid() for name, pid in pids.items() if name != "main"}
        assert server != pids["main"] and "forkserver" in " ".join(psutil.Process(server).cmdline())
        os.kill(pids["evaluator"], signal.SIGKILL)  # a dead evaluator is noticed and replaced
        deadline = time.monotonic() + 30
        while "restarting it (1/" not in (tmp_path / "log").read_text():
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "log").read_text()[-2000:]
            time.sleep(0.2)
        evals = len(read_scalars(run_dir, "eval/return")[0])
        _wait_for(run_dir, proc, "eval/return", evals + 1)  # the replacement evaluates
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
        children = [pid for name, pid in pids.items() if name not in ("main", "evaluator")]
        deadline = time.monotonic() + 10
        while alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(children), "workers still running 10 s after Ctrl-C"
        assert proc.wait(timeout=30) == 130  # then the final checkpoint, curves and summary
        deadline = time.monotonic() + 10
        while alive([server]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive([server]), "the fork server outlived its run"
        summary = _summary(run_dir)
        assert summary["status"] == "interrupted" and summary["evals"] >= 2 and summary["last_eval"]["episodes"] == 1
        assert summary["evaluator_restarts"] == 1 and not alive([summary["pids"]["evaluator"]])
        ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
        assert ckpt["counters"]["frames"] == summary["frames"] > 0
    finally:  # a failed assertion must not leave the run's processes behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_evaluate_cli_reports_mean_and_std_and_writes_a_video(smoke_run, tmp_path):
    run_dir, _ = smoke_run
    result = run_module("a3c.evaluate", f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", "episodes=2",
                        "video=true", "max_episode_frames=400", f"run_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "return: " in result.stdout and "over 2 greedy episodes" in result.stdout
    report = json.loads((tmp_path / "evaluation.json").read_text())
    assert len(report["scores"]) == 2 and report["return"] == pytest.approx(sum(report["scores"]) / 2)
    video = Path(report["video"])
    assert video.exists() and video.stat().st_size > 1000 and video.read_bytes()[4:8] == b"ftyp"


def test_periodic_evaluations_keep_up_with_training(tmp_path):
    """Evaluations much slower than an interval of training (4 games of up to 1,000 frames against 960 frames of
    training): the workers wait for a late one, so every result comes within one interval (plus the rollouts in
    flight: 2 workers x 320 frames) of its weights, no interval goes unevaluated, and the wait is counted. At nice 10
    and without the wait the evaluator fell further behind with every interval."""
    run_dir = tmp_path / "lag"
    interval, in_flight = 960, 2 * 2 * 20 * 4
    result = run_module("a3c.train", *SMOKE, f"total_frames={6 * interval}", f"eval.interval_frames={interval}",
                        "eval.episodes=4", "eval.max_episode_frames=1000", "eval.final_episodes=0", f"run_dir={run_dir}")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = _summary(run_dir)
    # what the run records (its shared statistics), not what worker 0 managed to log before it finished: each
    # evaluation blocks training one interval past its weights, so the evaluations of intervals 1-4 finished before
    # training could pass interval 5, whatever the timing
    evaluations = summary["evaluations"]
    labels = [e["frames"] for e in evaluations]
    lags = [e["result_frames"] - e["frames"] for e in evaluations]
    assert summary["evals"] == len(evaluations) >= 4
    assert all(0 <= lag <= interval + in_flight for lag in lags), lags
    assert max(lags) == summary["eval_max_lag_frames"] <= interval + in_flight
    assert [int(frames) // interval for frames in labels] == list(range(1, len(labels) + 1))  # none skipped
    logged, _ = read_scalars(run_dir, "eval/lag_frames")  # worker 0 logged a prefix of them
    assert logged == labels[:len(logged)]
    assert sum(summary["eval_wait_s"]) > 0 and summary["evaluator_restarts"] == 0
