"""The Ray engine (engine=ray): smoke runs per family with every invariant, a killed collector, resources that
cannot be had, config errors, and the per-round invariants on their own. Every run that starts Ray must leave no Ray
process behind."""
from __future__ import annotations

import math
import os
import signal
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
from offpolicy_helpers import run_cli, summary
from proc import start_module
from tensordict import TensorDict

from offpolicy.invariants import InvariantError
from offpolicy.ray_engine import CheckedStepper, RayMonitor
from offpolicy.train import compose_config
from shared.checkpoint import load_checkpoint
from shared.config import ConfigError

RAY_PROCESS_NAMES = ("raylet", "gcs_server")


def ray_processes() -> list[str]:
    """Names of the Ray processes running on this machine (a finished run must leave none)."""
    names = []
    for p in psutil.process_iter(["name", "status"]):
        name = p.info["name"] or ""
        if p.info["status"] != psutil.STATUS_ZOMBIE and (name in RAY_PROCESS_NAMES or name.startswith("ray::")):
            names.append(name)
    return names


def wait_no_ray(timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return ray_processes()


def test_ray_smoke_sac(tmp_path):
    """profile=ray_smoke: 2 collector actors, 2 Gloo learner ranks, 5 rounds of 400 transitions (2 of prefill)."""
    result = run_cli("algo=sac", "env=Pendulum-v1", "profile=ray_smoke", f"run_dir={tmp_path}", timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Ray: 2 collector actors x 1 envs, 2 gloo learner ranks x 32 samples" in result.stdout
    s = summary(tmp_path)
    assert s["engine"] == "ray" and s["status"] == "completed" and s["error"] is None
    # transitions written == collected (summed over both actors); 4 optimising rounds x 50 steps; the published
    # policy version is the learner's optimiser step count
    assert s["frames"] == 2000 and s["replay_writes"] == 2000 and s["batches"] == 5
    assert s["optim_steps"] == 200 and s["policy_version"] == 200
    assert s["episodes"] > 0 and math.isfinite(s["train_return_last"]) and math.isfinite(s["eval_return_last"])
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    learner = ckpt["learner"]
    assert learner["world_size"] == 2 and learner["model_version"] == 200 and len(learner["ranks"]) == 2
    # DDP keeps the ranks' networks equal
    a, b = (rank["loss_module"] for rank in learner["ranks"])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any((tmp_path / "logs" / "scalars" / "loss").glob("*.csv")), "no loss/ metrics logged"
    assert not wait_no_ray(), "Ray processes left behind"


def _wait_for_training(proc, run_dir, log, timeout=180.0) -> None:
    """Until the learner has trained a round (loss metrics exist): the steady state."""
    deadline = time.monotonic() + timeout
    losses = run_dir / "logs" / "scalars" / "loss"
    while time.monotonic() < deadline and not (losses.is_dir() and any(losses.iterdir())):
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(1)
    assert losses.is_dir(), "the run never trained: " + log.read_text()[-2000:]


def test_ray_ctrl_c_saves_and_leaves_no_ray_process(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it): the run finishes its round, saves every
    rank's learner state, writes the summary, exits 130 and leaves no Ray process."""
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start_module("offpolicy.train", "algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "total_frames=100000",
                        "eval.interval_frames=0", f"run_dir={run_dir}", log=log)
    try:
        _wait_for_training(proc, run_dir, log)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, log.read_text()[-3000:]
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["frames"] % 400 == 0 and s["optim_steps"] > 0
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert ckpt["learner"]["model_version"] == s["optim_steps"] == s["policy_version"]
    assert ckpt["counters"]["collected_frames"] == s["frames"]
    assert not wait_no_ray(), "Ray processes left behind after Ctrl-C"


def test_ray_dqn_killed_collector_then_resume(tmp_path):
    """DQN on CartPole with profile=ray_smoke. SIGKILL one collector actor: the run ends within 30 s with one error
    line, exit 4, a summary and a checkpoint of the learner at that frame count, and no Ray process left. Resuming
    from that checkpoint restores the ranks and completes the run with every invariant."""
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start_module("offpolicy.train", "algo=dqn", "env=CartPole-v1", "profile=ray_smoke", "total_frames=100000",
                        "eval.interval_frames=0", f"run_dir={run_dir}", log=log)
    try:
        _wait_for_training(proc, run_dir, log)
        collectors = [c for c in psutil.Process(proc.pid).children(recursive=True)
                      if c.name().startswith("ray::Collector")]
        assert collectors, "no collector actor is running: " + log.read_text()[-2000:]
        collectors[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=60)
        assert time.monotonic() - killed < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert code == 4, out[-3000:]
    assert "error: a Ray collector died (Collector, pid" in out
    failed = summary(run_dir)
    assert failed["status"] == "failed" and "collector died" in failed["error"]
    ckpt = load_checkpoint(failed["checkpoint"])
    assert ckpt["counters"]["collected_frames"] == failed["frames"]
    assert ckpt["learner"]["model_version"] == failed["optim_steps"] > 0
    assert not wait_no_ray()

    target = failed["frames"] + 800
    resumed = run_cli(f"resume={failed['checkpoint']}", f"total_frames={target}", timeout=280)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    s = summary(run_dir)
    # the replay actor starts empty, but the run is past its prefill: both new rounds optimise
    assert s["status"] == "completed" and s["frames"] == target and s["replay_writes"] == 800
    assert s["optim_steps"] == failed["optim_steps"] + 2 * 50 == s["policy_version"]
    assert s["episodes"] > failed["episodes"] and math.isfinite(s["eval_return_last"])
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["learner"]["model_version"] == s["optim_steps"]
    assert not wait_no_ray()


def test_unavailable_resources_fail_fast(tmp_path):
    """More CPUs than the cluster has: one error line and exit 2 within seconds, instead of actors waiting forever."""
    start = time.monotonic()
    result = run_cli("algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "ray.num_cpus=2", "ray.num_collectors=4",
                     "ray.collector_cpus=1", f"run_dir={tmp_path}", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: ray: the job needs 5 CPU (cluster has 2); allowed: fewer ray.num_collectors / ray.world_size, "
        "smaller ray.collector_cpus / learner_cpus / *_gpus, or a bigger cluster")
    assert time.monotonic() - start < 60
    assert not wait_no_ray()


@pytest.mark.parametrize("override,message", [
    ("replay.prioritized=true", "replay.prioritized=True is not allowed with engine=ray"),
    ("optim.batch_size=63", "optim.batch_size=63 is not allowed; allowed: a multiple of ray.world_size=2"),
    ("ray.num_collectors=3", "collector.frames_per_batch=400 is not allowed; allowed: a multiple of "
                             "ray.num_collectors * env.num_envs = 3"),
    ("ray.backend=nccl", "ray.learner_gpus=0.0 is not allowed with ray.backend=nccl"),
    ("ray.backend=mpi", "ray.backend='mpi' is not allowed; allowed: one of gloo, nccl"),
])
def test_ray_config_errors(override, message):
    """Checked while composing, before Ray starts (the CLI prints them as one ``error:`` line, exit 2)."""
    with pytest.raises(ConfigError) as info:
        compose_config(["algo=sac", "env=Pendulum-v1", "profile=ray_smoke", override])
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ray_nccl_learner(tmp_path):
    """NCCL learner ranks, one GPU each (as many ranks as GPUs, at most 2)."""
    ranks = min(torch.cuda.device_count(), 2)
    result = run_cli("algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "ray.backend=nccl", "ray.learner_gpus=1",
                     f"ray.world_size={ranks}", f"run_dir={tmp_path}", timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "completed" and s["optim_steps"] == 200 and s["policy_version"] == 200
    assert not wait_no_ray()


# --- the per-round invariants, without Ray -------------------------------------------------------------------------

def _round_stats(frames, version, returns=()):
    return {"round_frames": frames, "returns": list(returns), "lengths": [200] * len(returns),
            "version_lo": version, "version_hi": version, "reward_sum": -1.0 * frames,
            "actions": torch.zeros(frames, 1)}


def _monitor(stats, *, written, optim_before=0, optim_after=50, published=50):
    """A RayMonitor over fakes of the trainer, the collector actors and the replay actor."""
    cfg = SimpleNamespace(collector=SimpleNamespace(prefill_frames=0), optim=SimpleNamespace(batch_size=32),
                          logger=SimpleNamespace(interval_s=0.0))
    replay = SimpleNamespace(write_count=0)
    trainer = SimpleNamespace(
        collector=SimpleNamespace(map_fn=lambda name: stats), replay_buffer=replay, _optim_count=optim_before,
        collected_frames=0, _execution_backend=SimpleNamespace(model_version=optim_after),
        _published_model_version=published, _log_dict={"loss_qvalue": [torch.tensor(1.5)]})
    logged = []
    logger = SimpleNamespace(log=lambda metrics, step: logged.append(metrics))
    monitor = RayMonitor(cfg, trainer, logger, steps_per_batch=50, exploration_value=lambda: 0.0,
                         action_spec=SimpleNamespace(), discrete=True, start={})
    monitor.setup()

    class Replay:  # write_count and len after the round
        write_count = written

        def __len__(self):
            return written

    trainer.replay_buffer = Replay()
    trainer.collected_frames = written
    trainer._optim_count = optim_after
    return monitor, logged


def test_ray_monitor_accepts_a_consistent_round():
    monitor, logged = _monitor([_round_stats(200, 0, returns=[-100.0]), _round_stats(200, 0)], written=400)
    monitor()
    assert monitor.batches == 1 and monitor.version == 50 and monitor.episodes == 1
    assert logged[0]["train/return"] == -100.0
    assert logged[1]["loss/loss_qvalue"] == 1.5 and logged[1]["collector/actors"] == 2.0


@pytest.mark.parametrize("stats,written,kw,message", [
    ([_round_stats(200, 0), _round_stats(200, 0)], 399, {}, "replay received 399 transitions but the collectors "
                                                            "collected 400"),
    ([_round_stats(200, 0), _round_stats(200, 7)], 400, {}, "collector 1 used policy_version 7..7; expected 0"),
    ([_round_stats(200, 0), _round_stats(200, 0)], 400, {"optim_after": 49}, "ran 49 optimiser steps; expected 50"),
    ([_round_stats(200, 0), _round_stats(200, 0)], 400, {"published": 0}, "published policy version 0 vs learner "
                                                                          "optimiser version 50"),
])
def test_ray_monitor_catches_a_broken_invariant(stats, written, kw, message):
    monitor, _ = _monitor(stats, written=written, **kw)
    with pytest.raises(InvariantError, match=message.replace(".", r"\.")):
        monitor()


def test_learner_rank_checks_each_sample():
    """What every Ray learner rank checks before a step: shape, keys, and no policy_version from its future."""
    from functools import partial

    from offpolicy.invariants import check_sample_batch

    keys = {"observation": torch.zeros(32, 3), "action": torch.zeros(32, 1),
            "next": {"observation": torch.zeros(32, 3), "reward": torch.zeros(32, 1),
                     "done": torch.zeros(32, 1, dtype=torch.bool), "terminated": torch.zeros(32, 1, dtype=torch.bool),
                     "policy_version": torch.full((32, 1), 7)}}
    steps = []

    class Inner:
        updates_replay_priority = False

        def _step(self, context, sample):
            steps.append(sample.batch_size)
            return TensorDict()

    stepper = CheckedStepper(Inner(), partial(check_sample_batch, shape=(32,)), threads=torch.get_num_threads())
    learner = SimpleNamespace(model_version=7)
    stepper._step(learner, TensorDict(keys, batch_size=[32]))
    assert steps == [torch.Size([32])]
    with pytest.raises(InvariantError, match=r"shape \(16,\); expected \(32,\)"):
        stepper._step(learner, TensorDict(keys, batch_size=[32])[:16])
    with pytest.raises(InvariantError, match="lacks keys"):
        stepper._step(learner, TensorDict(keys, batch_size=[32]).exclude("action"))
    with pytest.raises(InvariantError, match="policy_version 7 on a learner at version 6"):
        stepper._step(SimpleNamespace(model_version=6), TensorDict(keys, batch_size=[32]))
    assert len(steps) == 1
