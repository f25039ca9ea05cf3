"""Env and replay options of the off-policy engine: observation normalisation (statistics from init steps, kept in
checkpoints, used by the evaluation env), memmap replay (files on disk, reopened on resume, reruns into the same
dir), and parallel envs (serial or one process per env)."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import summary, train_inprocess

from offpolicy import envs
from offpolicy.builder import Builder
from offpolicy.config import compose_config
from shared.checkpoint import load_checkpoint


def _cfg(*overrides):
    cfg, _ = compose_config(["algo=sac", "env=Pendulum-v1", "profile=smoke", *overrides])
    return cfg


def test_obs_norm_standardises_observations():
    torch.manual_seed(0)
    env = envs.make_train_env(_cfg("env.obs_norm=true", "env.obs_norm_init_steps=1000"))
    stats = envs.obs_norm_state(env)
    # replay the init steps: same env seed, same random actions (torch seed), rollouts until 1000 steps
    torch.manual_seed(0)
    raw = envs.make_train_env(_cfg())
    try:
        data, steps = [], 0
        while steps < 1000:
            obs = raw.rollout(1000)["observation"]
            steps += obs.shape[0]
            data.append(obs)
        init_data = torch.cat(data)
        normed = (init_data - stats["loc"]) / stats["scale"]
        assert torch.allclose(normed.mean(0), torch.zeros(3), atol=1e-4), normed.mean(0)
        assert torch.allclose(normed.std(0), torch.ones(3), atol=1e-2), normed.std(0)
        assert init_data.std(0).max() > 1.5  # Pendulum's angular velocity is far from standardised by itself
    finally:
        env.close()
        raw.close()


def test_obs_norm_statistics_are_checkpointed_and_used_for_evaluation(tmp_path):
    run = tmp_path / "run"
    s = train_inprocess("algo=sac", "env=Pendulum-v1", "profile=smoke", "env.obs_norm=true", f"run_dir={run}")
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    stats = ckpt["obs_norm"]
    assert {"loc", "scale"} <= set(stats) and stats["loc"].shape == (3,) and (stats["scale"] > 0).all()
    cfg = _cfg("env.obs_norm=true")
    eval_env = envs.make_eval_env(cfg, obs_norm=stats)
    plain = envs.make_eval_env(cfg)
    try:
        normed, raw = eval_env.reset()["observation"], plain.reset()["observation"]  # same seed, same start
        assert torch.allclose(normed, (raw - stats["loc"]) / stats["scale"], atol=1e-5)
    finally:
        eval_env.close()
        plain.close()
    # a resumed run keeps the statistics instead of recomputing them
    resumed = train_inprocess(f"resume={run / 'checkpoints' / 'last.pt'}", "total_env_steps=400")
    assert resumed["env_steps"] == 400 and s["env_steps"] == 300
    again = load_checkpoint(run / "checkpoints" / "last.pt")["obs_norm"]
    assert torch.equal(again["loc"], stats["loc"]) and torch.equal(again["scale"], stats["scale"])


def test_memmap_replay_is_on_disk_reopened_on_resume_and_rerun(tmp_path):
    run = tmp_path / "run"
    args = ("algo=sac", "env=Pendulum-v1", "profile=smoke", "replay.storage=memmap", f"run_dir={run}")
    first = train_inprocess(*args)
    files = sorted(p.name for p in (run / "replay").rglob("*.memmap"))
    assert "observation.memmap" in files and "action.memmap" in files
    from tensordict import TensorDict

    on_disk = TensorDict.load_memmap(run / "replay")
    assert on_disk.shape == (10_000,)  # replay.size of the smoke profile, preallocated on disk
    written = on_disk["observation"][:300].clone()
    assert written.abs().sum() > 0
    ckpt = load_checkpoint(run / "checkpoints" / "last.pt")
    assert ckpt["replay"]["_storage"]["_len"] == 300 and "_storage" not in ckpt["replay"]["_storage"]
    # resume: the buffer reopens the files (300 transitions) and appends 100 more
    resumed = train_inprocess(f"resume={run / 'checkpoints' / 'last.pt'}", "total_env_steps=400")
    assert first["replay_writes"] == 300 and resumed["replay_writes"] == 400
    reopened = TensorDict.load_memmap(run / "replay")
    assert torch.equal(reopened["observation"][:300], written)  # the old data was kept, not overwritten
    # a fresh run into the same directory works (overwrites)
    rerun = train_inprocess(*args)
    assert rerun["status"] == "completed" and rerun["replay_writes"] == 300


@pytest.mark.parametrize("vector", ["serial", "process"])
def test_parallel_envs_collect_num_envs_trajectories(vector):
    cfg = _cfg("env.num_envs=2", f"env.vector={vector}", "collector.env_steps_per_batch=100")
    env = envs.make_train_env(cfg)

    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    assert batch.batch_size == (2, 50)
    assert not torch.allclose(batch["observation"][0], batch["observation"][1])  # seeded apart
    assert (batch["collector", "traj_ids"][0] != batch["collector", "traj_ids"][1]).all()
    assert batch.reshape(-1).batch_size == (100,)


def test_smoke_run_with_parallel_envs(tmp_path):
    s = train_inprocess("algo=td3", "env=Pendulum-v1", "profile=smoke", "env.num_envs=2", "env.vector=serial",
                        f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["replay_writes"] == 300
    assert summary(tmp_path)["batches"] == 3


def test_pixel_observations_train_through_a_conv_encoder(tmp_path):
    from shared.models import PixelEncoder

    cfg = _cfg("env=HalfCheetah-v5", "env.from_pixels=true")
    env = envs.make_train_env(cfg)
    try:
        spec = env.observation_spec_unbatched["observation"]
        assert spec.dtype == torch.uint8 and tuple(spec.shape) == (3, 64, 64)
        parts = Builder(cfg).parts(env)
        assert any(isinstance(m, PixelEncoder) for m in parts.loss.actor_network.modules())
        assert any(isinstance(m, PixelEncoder) for m in parts.loss.qvalue_network.modules())
    finally:
        env.close()
    s = train_inprocess("algo=sac", "env=HalfCheetah-v5", "profile=smoke", "env.from_pixels=true", "env.image_size=48",
                        "optim.utd_ratio=0.25", "eval.interval_env_steps=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["optim_steps"] == 50 and s["eval_return_last"] is not None


def test_ddpg_with_td1_prioritized_memmap_and_obs_norm_together(tmp_path):
    from offpolicy_helpers import run_cli

    proc = run_cli("algo=ddpg", "env=Pendulum-v1", "profile=smoke", "loss.value_estimator=td1", "replay.slice_len=8",
                   "replay.prioritized=true", "replay.storage=memmap", "env.obs_norm=true", f"run_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = summary(tmp_path)
    assert s["status"] == "completed" and s["replay_writes"] == 300 and s["optim_steps"] == 200
    assert (tmp_path / "replay" / "observation.memmap").exists()
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert ckpt["obs_norm"]["scale"].shape == (3,)
    priorities = ckpt["replay"]["_sampler"]["_sum_tree"][:300]
    assert priorities.min() > 0 and priorities.std() > 0  # the TD errors of 200 steps were written back


def test_replay_journal_rolls_the_files_back_to_a_checkpoint(tmp_path):
    """Writes after a checkpoint overwrite a wrapped memmap ring; the journal puts the checkpoint's content back."""
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

    from offpolicy.replay import ReplayJournal

    replay = TensorDictReplayBuffer(storage=LazyMemmapStorage(50, scratch_dir=str(tmp_path / "replay"), existsok=True))
    journal = ReplayJournal(tmp_path / "replay-journal")

    def write(start):
        batch = TensorDict({"x": torch.arange(start, start + 20.0).unsqueeze(-1)}, batch_size=[20])
        journal.before_write(replay, 20)
        replay.extend(batch)

    for start in (0, 20, 40):  # 60 writes: wrapped once
        write(start)
    journal.checkpointed(replay.write_count)  # checkpoint A at 60
    at_checkpoint = replay.storage.get(torch.arange(50))["x"].clone()
    for start in (60, 80, 100):  # overwrites the whole ring
        write(start)
    journal.checkpointed(replay.write_count)  # checkpoint B at 120 (A's journals are still kept)
    write(120)
    assert not torch.equal(replay.storage.get(torch.arange(50))["x"], at_checkpoint)
    restored = journal.roll_back(tmp_path / "replay", write_count=60)  # resume from A
    assert restored == 80
    assert torch.equal(TensorDict.load_memmap(tmp_path / "replay")["x"], at_checkpoint)
    assert not any((tmp_path / "replay-journal").iterdir())


def test_memmap_replay_resumes_from_a_checkpoint_older_than_its_files(tmp_path):
    """A crash after more rounds than the last checkpoint: the ring has wrapped since it, and the resume still trains
    (before the journal it stopped at the first sample: a transition of a policy newer than the learner)."""
    import shutil

    run = tmp_path / "run"
    args = ("algo=dqn", "env=CartPole-v1", "profile=smoke", "replay.storage=memmap", "replay.size=250",
            "collector.prefill_env_steps=100", f"run_dir={run}")
    first = train_inprocess(*args, "total_env_steps=400")
    assert first["status"] == "completed"
    shutil.copy(first["checkpoint"], tmp_path / "at-400.pt")
    later = train_inprocess(*args, "total_env_steps=700", f"resume={first['checkpoint']}")
    assert later["status"] == "completed" and later["replay_writes"] == 700  # the ring was overwritten since 400
    resumed = train_inprocess(*args, "total_env_steps=600", f"resume={tmp_path / 'at-400.pt'}")
    assert resumed["status"] == "completed" and resumed["error"] is None
    assert resumed["replay_writes"] == 600 and resumed["optim_steps"] == first["optim_steps"] + 2 * (
        later["optim_steps"] - first["optim_steps"]) // 3
