"""Checkpoint and resume: a run resumed from its checkpoint continues its counters, weights, optimisers and
exploration state (and, optionally, its replay buffer) exactly where it stopped; Ctrl-C stops cleanly and saves."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from offpolicy_helpers import REPO, summary, train_inprocess

from shared.checkpoint import load_checkpoint

ARGS = ("algo=dqn", "profile=smoke", "eval.interval_env_steps=0", "eval.final_episodes=0", "dqn.eps_anneal_env_steps=1000")


def _run_and_resume(root: Path, with_replay: bool) -> dict:
    """A 200-step run in ``root/run`` (its checkpoint kept as ``root/first.pt``), then resumed to 400 env steps: the
    summaries of both and the two checkpoints."""
    run_dir = root / "run"
    first = train_inprocess(*ARGS, "total_env_steps=200", f"replay.in_checkpoint={str(with_replay).lower()}",
                            f"run_dir={run_dir}")
    shutil.copyfile(run_dir / "checkpoints" / "last.pt", root / "first.pt")
    second = train_inprocess(f"resume={run_dir / 'checkpoints' / 'last.pt'}", "total_env_steps=400")
    return {"run_dir": run_dir, "first": first, "second": second, "first_ckpt": root / "first.pt",
            "last_ckpt": run_dir / "checkpoints" / "last.pt"}


# Shared by the tests that only read these runs' summaries and checkpoints (a resume of first.pt goes to a run dir of
# its own): each pair of in-process runs costs seconds.
@pytest.fixture(scope="module")
def resumed_without_replay(tmp_path_factory):
    return _run_and_resume(tmp_path_factory.mktemp("without_replay"), with_replay=False)


@pytest.fixture(scope="module")
def resumed_with_replay(tmp_path_factory):
    return _run_and_resume(tmp_path_factory.mktemp("with_replay"), with_replay=True)


@pytest.mark.parametrize("with_replay", [False, True])
def test_resume_continues_the_run(request, with_replay):
    runs = request.getfixturevalue("resumed_with_replay" if with_replay else "resumed_without_replay")
    first, second = runs["first"], runs["second"]
    assert first["env_steps"] == 200 and first["batches"] == 2 and first["optim_steps"] == 50
    ckpt = load_checkpoint(runs["first_ckpt"])
    assert ckpt["counters"]["env_steps"] == 200 and ckpt["counters"]["optim_steps"] == 50
    assert (ckpt["replay"] is not None) == with_replay
    eps_saved = float(ckpt["exploration"]["eps"])
    assert eps_saved < 1.0  # annealed by the 200 collected env steps

    assert second["run_dir"] == str(runs["run_dir"]) and second["status"] == "completed"
    assert second["env_steps"] == 400 and second["batches"] == 4 and second["policy_version"] == 4
    # without the saved replay the buffer must be prefilled again (one batch without optimiser steps)
    assert second["optim_steps"] == (50 + 100 if with_replay else 50 + 50)
    assert second["replay_writes"] == (400 if with_replay else 200)
    after = load_checkpoint(runs["last_ckpt"])
    assert float(after["exploration"]["eps"]) < eps_saved  # annealing continued from the saved epsilon
    assert after["learner"]["optimizers"]["q"]["state"]  # Adam moments were restored and kept
    assert after["learner"]["steps"] == second["optim_steps"]


def test_restore_brings_back_weights_optimiser_and_counters(resumed_without_replay, tmp_path):
    from offpolicy.builder import Builder
    from offpolicy.config import compose_config
    from offpolicy.engines.local import LocalEngine
    from offpolicy.envs import make_train_env

    path = resumed_without_replay["first_ckpt"]  # a 200-step run's checkpoint
    ckpt = load_checkpoint(path)
    assert ckpt["counters"]["env_steps"] == 200 and ckpt["counters"]["batches"] == 2
    cfg, _ = compose_config([f"resume={path}"])
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    engine = LocalEngine(Builder(cfg), env, parts, tmp_path, cfg.seed)
    try:
        engine.restore(ckpt["learner"], version=ckpt["counters"]["batches"])
        state = parts.loss.state_dict()
        assert all(torch.equal(state[k], v) for k, v in ckpt["learner"]["loss"].items())
        assert parts.optimizers["q"].state_dict()["state"][0]["step"] == 50
        assert engine.learner.steps == 50 and engine.collector.policy_version == 2
        assert engine.learner.target_updater.updates == ckpt["learner"]["target_updates"] == 50
        assert engine.collect().version_lo == 2  # the next batch carries the restored version
    finally:
        engine.close()


def test_resume_at_the_end_runs_nothing(resumed_without_replay, tmp_path):
    again = train_inprocess(f"resume={resumed_without_replay['first_ckpt']}", "total_env_steps=200",
                            f"run_dir={tmp_path}")
    assert again["env_steps"] == 200 and again["optim_steps"] == 50 and again["status"] == "completed"


def _interrupt_when(tmp_path, ready, *args) -> tuple[int, float, str, Path]:
    """Run ``offpolicy.train ARGS args`` as a subprocess, send Ctrl-C once ``ready(run_dir, log_text)`` holds; return
    (exit code, seconds from Ctrl-C to exit, log text, run dir)."""
    run_dir = tmp_path / "run"
    log = tmp_path / "log.txt"
    proc = subprocess.Popen([sys.executable, "-m", "offpolicy.train", *ARGS, *args, f"run_dir={run_dir}"], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not ready(run_dir, log.read_text()):
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-2000:]
        started = time.time()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        return code, time.time() - started, log.read_text(), run_dir
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_stops_cleanly_and_saves(tmp_path):
    code, _, log, run_dir = _interrupt_when(
        tmp_path, lambda run_dir, _: (run_dir / "logs" / "scalars" / "train" / "optim_steps.csv").exists(),
        "total_env_steps=100000000")
    assert code == 130, log[-2000:]
    assert "Traceback" not in log
    s = summary(run_dir)
    assert s["status"] == "interrupted" and 0 < s["env_steps"] < 100000000
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert ckpt["counters"]["env_steps"] == s["env_steps"]
    assert ckpt["counters"]["optim_steps"] == s["optim_steps"]


def _prefill_logged(run_dir) -> bool:
    """The prefill round (smoke: the first, 0 optimiser steps) is logged: the round running now learns."""
    from shared.logging import read_scalars

    try:
        return len(read_scalars(run_dir, "train/optim_steps")[1]) >= 1
    except ValueError:  # a row being written
        return False


def test_a_second_ctrl_c_stops_mid_round_and_the_checkpoint_resumes(tmp_path):
    """Ctrl-C twice while the learner is inside a long round: the run stops after the current optimiser step, the
    round is recorded as it ran (counters = the learner's steps), and the checkpoint resumes without an invariant
    error (it used to save the learner ahead of the counters)."""
    # 100,000 optimiser steps per 100-step batch: a round of many seconds on any host (5,000 compiled CartPole steps
    # once took under the test's one second, and both Ctrl-Cs came after the round)
    long_rounds = ("optim.utd_ratio=1000", "total_env_steps=100000000")
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    proc = subprocess.Popen([sys.executable, "-m", "offpolicy.train", *ARGS, *long_rounds, f"run_dir={run_dir}"],
                            cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not _prefill_logged(run_dir):
            time.sleep(0.1)  # the prefill round is logged: the first learning round (100,000 steps) is running
        proc.send_signal(signal.SIGINT)
        # the second one only once the first was handled: Python runs one handler for signals that arrive while the
        # main thread is still inside a C call (a slow host once merged the two here)
        while time.time() < deadline and "stopping after this round" not in log.read_text():
            time.sleep(0.05)
        # and past the round's collection (100 CartPole steps, a tenth of a second) into its 100,000 optimiser steps
        # (seconds): both Ctrl-Cs inside the collection stop the round before its first step (a busy host once did)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 130 and "Traceback" not in text, text[-2000:]
    assert "stopping after the current optimiser step" in text
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    steps = ckpt["learner"]["steps"]
    assert steps == ckpt["counters"]["optim_steps"] and steps % 100_000 != 0  # stopped inside a round, counted as run
    resumed = train_inprocess(f"resume={run_dir / 'checkpoints' / 'last.pt'}",
                              f"total_env_steps={ckpt['counters']['env_steps'] + 300}", "optim.utd_ratio=0.5")
    assert resumed["status"] == "completed" and resumed["error"] is None
    # three more rounds: the replay (not in the checkpoint) refills the 200-step prefill, then two rounds of 50
    # steps; nothing lost or counted twice
    assert resumed["optim_steps"] == steps + 100


def test_ctrl_c_during_the_final_evaluation_still_writes_the_summary(tmp_path):
    seen = {}

    def in_final_evaluation(run_dir, log):  # a second after it started: inside its episodes
        if "final evaluation:" in log:
            seen.setdefault("at", time.time())
        return "at" in seen and time.time() - seen["at"] > 1.0

    code, stopped_in, log, run_dir = _interrupt_when(tmp_path, in_final_evaluation, "eval.final_episodes=100000")
    assert code == 130 and stopped_in < 10, log[-2000:]
    assert "Traceback" not in log
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["env_steps"] == 300  # training had finished (smoke: 300 frames)
    assert (run_dir / "checkpoints" / "last.pt").exists() and (run_dir / "curves.png").exists()


def test_a_resumed_run_plays_new_episodes(resumed_with_replay):
    """The env seed of a resumed run is derived from the seed and the frame count: its first episode is not the
    first run's first episode again (CartPole's reset state is the same for the same seed). The run: 200 steps with
    the replay in the checkpoint, resumed to 400."""
    from shared.checkpoint import resumed_seed

    assert resumed_seed(7, 0) == 7 and resumed_seed(7, 200) == resumed_seed(7, 200) != resumed_seed(7, 400) != 7
    observations = load_checkpoint(resumed_with_replay["last_ckpt"])["replay"]["_storage"]["_storage"]["observation"]
    assert not torch.equal(observations[200], observations[0])  # the resumed segment's first reset is a new one


def test_kill_9_at_random_moments_always_leaves_a_checkpoint_that_resumes(tmp_path):
    """SIGKILL (no handler runs) at random moments, three times in a row, each time resuming from the last checkpoint
    on disk: checkpoints are written atomically and only at round boundaries, so every one resumes, the counters only
    move forward, and the last run completes with every invariant holding."""
    import random

    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "last.pt"
    rng = random.Random(0)
    # eager: what is tested is the checkpoint on disk, and compiling the step (the default for so long a run) in each
    # of the three processes only delays the kills
    args = [*ARGS, "checkpoint.interval_s=1", "optim.utd_ratio=5", "total_env_steps=100000000", "compile.enabled=false",
            f"run_dir={run_dir}"]
    seen = []
    for attempt in range(3):
        cmd = args if attempt == 0 else [f"resume={ckpt}", "total_env_steps=100000000"]
        proc = subprocess.Popen([sys.executable, "-m", "offpolicy.train", *cmd], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            before = ckpt.stat().st_mtime if ckpt.exists() else 0.0
            deadline = time.time() + 120
            while time.time() < deadline and not (ckpt.exists() and ckpt.stat().st_mtime > before):
                time.sleep(0.05)  # this attempt has written a checkpoint of its own
            time.sleep(rng.uniform(0.0, 2.0))  # then anywhere: collecting, learning or writing the next one
            assert proc.poll() is None  # still training when killed
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        state = load_checkpoint(ckpt)
        assert state["learner"]["steps"] == state["counters"]["optim_steps"]
        seen.append(state["counters"]["env_steps"])
    assert seen == sorted(seen) and seen[0] > 0
    # at UTD 0.5 instead of the killed runs' 5: what is checked is that it resumes and completes its rounds with the
    # invariants holding, not how many updates it makes
    final = train_inprocess(f"resume={ckpt}", f"total_env_steps={seen[-1] + 300}", "optim.utd_ratio=0.5")
    assert final["status"] == "completed" and final["error"] is None and final["env_steps"] == seen[-1] + 300
