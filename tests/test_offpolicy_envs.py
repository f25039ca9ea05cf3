"""Other envs and outputs: DQN on an ALE game through the shared Atari env, and MuJoCo evaluation videos."""
from __future__ import annotations

import os

import pytest

from offpolicy_helpers import train_inprocess

from shared.logging import read_scalars


@pytest.mark.parametrize("name", ["Pong", "CartPole-v1"])
def test_the_run_s_envs_take_the_kind_the_config_decided(name, monkeypatch):
    """``env.kind`` is read off the name once, when composing: the training and evaluation envs are built from the
    config's kind (reading the name again raises here)."""
    from offpolicy.config import compose_config
    from offpolicy.envs import make_eval_env, make_train_env
    from shared import envs

    cfg, _ = compose_config(["algo=dqn", f"env={name}"])

    def read_again(name):
        raise AssertionError(f"env_kind({name!r}) called again")

    monkeypatch.setattr(envs, "env_kind", read_again)
    for env in (make_train_env(cfg), make_eval_env(cfg)):
        try:
            assert env.observation_spec_unbatched["observation"].shape == ((4, 84, 84) if name == "Pong" else (4,))
        finally:
            env.close()


@pytest.mark.parametrize("name", ["Pong", "ALE/Pong-v5", "PongNoFrameskip-v4", "breakout"])
def test_every_ale_spelling_is_the_shared_atari_env(name):
    from offpolicy.config import compose_config
    from offpolicy.envs import make_train_env

    cfg, _ = compose_config(["algo=dqn", f"env={name}"])
    env = make_train_env(cfg)
    try:
        assert env.observation_spec_unbatched["observation"].shape == (4, 84, 84)
        assert "life_lost" in env.rollout(2)["next"].keys()  # the shared Atari stack, not plain Gymnasium
    finally:
        env.close()


def test_dqn_on_atari_evaluates_whole_games(tmp_path, capsys):
    """A full id trains off-policy; evaluation plays a whole game (eval.max_episode_steps, 20 here, is for
    non-Atari envs): an untrained agent loses 21 to at most a few points, in hundreds of steps. The start line says
    which precision the CNN computes in. One update per 10 env steps (as profile=atari): a Nature-CNN update costs
    tens of ms here, and what is checked is that the run learns on Atari frames, not how much."""
    from shared.models import conv_precision

    s = train_inprocess("algo=dqn", "env=ALE/Pong-v5", "profile=smoke", "replay.size=300", "optim.utd_ratio=0.1",
                        "eval.interval_env_steps=0", "eval.max_episode_steps=20", f"run_dir={tmp_path}")
    assert f"Q network CNN in {conv_precision('auto', 'cpu')} (dqn.conv_precision=auto); " in capsys.readouterr().out
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["optim_steps"] == 20  # 2 rounds x 10
    steps, returns = read_scalars(tmp_path, "eval/return")
    _, lengths = read_scalars(tmp_path, "eval/length")
    assert steps == [300.0] and float(returns[0]).is_integer() and -21 <= returns[0] <= -10
    assert lengths[0] > 500  # a whole game, not 20 steps of one


def test_mujoco_eval_writes_video(tmp_path):
    os.environ.setdefault("MUJOCO_GL", "egl")
    s = train_inprocess("algo=td3", "env=Hopper-v5", "profile=smoke", "eval.video=true", "eval.max_episode_steps=20",
                        "eval.interval_env_steps=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed"
    video = tmp_path / "videos" / "eval-300.mp4"
    assert video.exists() and video.stat().st_size > 1000
    assert video.read_bytes()[4:8] == b"ftyp"  # an mp4 container


def test_batched_envs_are_flattened_into_replay(tmp_path):
    from shared.checkpoint import load_checkpoint

    s = train_inprocess("algo=dqn", "profile=smoke", "env.num_envs=2", "replay.in_checkpoint=true",
                        "eval.interval_env_steps=0", "eval.final_episodes=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["replay_writes"] == 300
    replay = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["replay"]
    observations = replay["_storage"]["_storage"]["observation"]
    assert observations.shape[1:] == (4,)  # [capacity, obs_dim]: the [2, 50] rollouts went in as 100 transitions


def test_tensorboard_backend(tmp_path):
    s = train_inprocess("algo=dqn", "profile=smoke", "logger.backend=tensorboard", "eval.interval_env_steps=0",
                        "eval.final_episodes=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed"
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert read_scalars(tmp_path, "train/optim_steps")[0]  # CSV is always written too


def test_seed_streams_of_collectors_and_evaluation_never_overlap():
    """profile=scale has 4 collectors x 25,000 envs: every copy gets its own seed, and the evaluation env's stream is
    none of them (the old scheme, collector k at seed + 1000 k and evaluation at seed + 10,000, repeated 24,000
    streams per collector)."""
    from offpolicy.envs import collector_seed, eval_seed

    for seed in (0, 7):
        n = 25_000
        seeds = [collector_seed(seed, k, n) + j for k in range(4) for j in range(n)]
        assert len(set(seeds)) == 4 * n
        assert eval_seed(seed) not in set(seeds) and eval_seed(seed) == eval_seed(seed)
    assert eval_seed(0) != eval_seed(1)
