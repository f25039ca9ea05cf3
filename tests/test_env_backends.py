"""Batched env backends (``env.backend``): envpool steps ``[N]`` copies with the Gymnasium task's specs and only real
transitions; a backend that cannot run here is one ``error:`` line naming the missing piece."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import run_cli, train_inprocess

pytest.importorskip("envpool")


def _envpool(name: str, n: int, seed: int = 0):
    from shared.env_backends import make_batched_env

    return make_batched_env("envpool", name, n, seed)


@pytest.mark.parametrize("name", ["HalfCheetah-v5", "Pendulum-v1", "CartPole-v1"])
def test_envpool_specs_equal_the_gymnasium_task(name):
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import check_env_specs

    n = 5
    env, gym = _envpool(name, n), GymEnv(name)
    try:
        check_env_specs(env)
        assert env.batch_size == (n,)
        assert env.observation_spec["observation"] == gym.observation_spec["observation"].expand(
            n, *gym.observation_spec["observation"].shape)
        assert env.action_spec == gym.action_spec.expand(n, *gym.action_spec.shape)
        assert env.reward_spec.shape == (n, 1) and env.full_done_spec["terminated"].shape == (n, 1)
        step = env.rand_step(env.reset())
        assert step["next", "observation"].shape == (n, *gym.observation_spec["observation"].shape)
    finally:
        env.close()
        gym.close()


def test_envpool_records_only_real_steps():
    """CartPole pays 1 for every real step; envpool's own next-step autoreset would add 0-reward reset steps."""
    env = _envpool("CartPole-v1", 4)
    try:
        rollout = env.rollout(200, break_when_any_done=False)
    finally:
        env.close()
    assert rollout["next", "done"].sum() >= 8  # random actions end episodes every ~20 steps
    assert torch.all(rollout["next", "reward"] == 1.0)


def test_envpool_truncates_at_the_time_limit_and_seeds():
    env = _envpool("HalfCheetah-v5", 2, seed=3)
    try:
        rollout = env.rollout(1001, break_when_any_done=False)
        first = env.reset()["observation"]
    finally:
        env.close()
    truncated, terminated = rollout["next", "truncated"].squeeze(-1), rollout["next", "terminated"]
    assert truncated[:, 999].all() and truncated.sum() == 2 and not terminated.any()  # 1000-step episodes
    again, other = _envpool("HalfCheetah-v5", 2, seed=3), _envpool("HalfCheetah-v5", 2, seed=4)
    try:
        assert torch.equal(again.reset()["observation"], rollout[:, 0]["observation"])  # same seed, same starts
        assert not torch.equal(other.reset()["observation"], rollout[:, 0]["observation"])
    finally:
        again.close()
        other.close()
    assert first.shape == (2, 17)


def test_sac_trains_on_envpool(tmp_path):
    s = train_inprocess("algo=sac", "profile=smoke", "env.backend=envpool", "env.num_envs=4", f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["replay_writes"] == 300
    assert s["optim_steps"] == 200 and s["eval_return_last"] is not None


def test_backend_that_does_not_exist_is_one_error_line(tmp_path):
    result = run_cli("algo=sac", "env.backend=mujoco_torch", f"run_dir={tmp_path / 'run'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: env.backend='mujoco_torch' is not allowed"), lines
    assert lines[0].endswith("allowed: one of gymnasium, envpool") and not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, needle", [
    (["algo=dqn", "env=Pong", "env.backend=envpool"], "env.backend=envpool is not allowed for env.name='Pong'"),
    (["algo=dqn", "env=Taxi-v4", "env.backend=envpool"], "env.name='Taxi-v4' observes Discrete(500)"),
])
def test_envpool_refuses_what_it_cannot_step(args, needle):
    from offpolicy.config import compose_config
    from shared.config import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_config(args)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value)


def test_envpool_names_the_tasks_it_lacks():
    """(Every Box-observation Gymnasium id installed here is an envpool task, so the backend check is called
    directly: Taxi's discrete observations are refused before it when composing.)"""
    from shared.config import ConfigError
    from shared.env_backends import check_backend

    with pytest.raises(ConfigError, match=r"^env.name='Taxi-v4' is not an envpool task; allowed with "
                                          r"env.backend=envpool: Taxi-v3$"):
        check_backend("envpool", "Taxi-v4")
