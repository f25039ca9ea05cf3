"""The local lean collector (offpolicy/collection.py) against the env itself and against torchrl's Collector: every
recorded transition is the env's own (replayed step by step in an independent Gymnasium env from the same seed), the
final observation of an episode is its real last one, the episode statistics and trajectory ids follow the episodes,
and a batch has the keys, shapes and dtypes of the Collector's batch."""
from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from offpolicy.builder import Builder
from offpolicy.collection import LeanCollector, lean_collection
from offpolicy.config import compose_config
from offpolicy.engines import engine_class
from offpolicy.envs import make_train_env

ENGINE_KEYS = ["observation", "action", "is_init", "step_count", ("collector", "traj_ids"), ("next", "observation"),
               ("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", "truncated"),
               ("next", "episode_reward"), ("next", "step_count"), ("next", "policy_version")]


def _batch(algo, env_name, *overrides, seed=3):
    cfg, _ = compose_config([f"algo={algo}", f"env={env_name}", "profile=smoke", "collector.env_steps_per_batch=400",
                             f"seed={seed}", *overrides])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    try:
        return cfg, collector, next(iter(collector)), next(iter(collector))
    finally:
        collector.shutdown()


@pytest.mark.parametrize("algo, env_name", [("dqn", "CartPole-v1"), ("sac", "Pendulum-v1")])
def test_every_transition_is_the_envs_own(algo, env_name):
    """Replay the recorded actions in a fresh Gymnasium env from the same seed: observations, rewards, terminations,
    truncations and final observations match step for step, across episode ends and across two batches."""
    cfg, collector, first, second = _batch(algo, env_name)
    assert isinstance(collector, LeanCollector)
    batch = torch.cat([first, second], dim=1)[0]  # the one env copy, 800 steps
    env = gym.make(env_name)
    obs, _ = env.reset(seed=3)
    episodes, length, total = 0, 0, 0.0
    for t in range(batch.shape[0]):
        assert torch.allclose(batch["observation"][t], torch.as_tensor(obs, dtype=torch.float32))
        assert bool(batch["is_init"][t]) == (length == 0)
        action = batch["action"][t]
        obs, reward, terminated, truncated, _ = env.step(int(action.argmax()) if algo == "dqn" else action.numpy())
        length, total = length + 1, total + float(reward)
        nxt = batch["next"][t]
        assert torch.allclose(nxt["observation"], torch.as_tensor(obs, dtype=torch.float32))  # the real last one
        assert float(nxt["reward"]) == pytest.approx(float(reward))
        assert (bool(nxt["terminated"]), bool(nxt["truncated"])) == (terminated, truncated)
        assert bool(nxt["done"]) == (terminated or truncated)
        assert int(nxt["step_count"]) == length and float(nxt["episode_reward"]) == pytest.approx(total, rel=1e-5)
        if terminated or truncated:
            obs, _ = env.reset()
            episodes, length, total = episodes + 1, 0, 0.0
    assert episodes >= 3  # CartPole's random-policy episodes end often; Pendulum is truncated every 200 steps
    ids = batch["collector", "traj_ids"]
    starts = batch["is_init"].reshape(-1)
    assert torch.equal(ids[1:] != ids[:-1], starts[1:])  # a new trajectory id exactly where an episode starts
    assert torch.equal(second["next", "policy_version"], torch.zeros_like(second["next", "policy_version"]))


@pytest.mark.parametrize("algo, env_name", [("dqn", "CartPole-v1"), ("td3", "Pendulum-v1")])
def test_a_batch_has_the_collectors_keys_shapes_and_dtypes(algo, env_name):
    _, _, lean, _ = _batch(algo, env_name, "env.num_envs=4")
    _, collector, torchrl_batch, _ = _batch(algo, env_name, "env.num_envs=4", "collector.lean=false")
    assert not isinstance(collector, LeanCollector)
    assert lean.batch_size == torchrl_batch.batch_size == torch.Size([4, 100])
    for key in ENGINE_KEYS:
        assert lean.get(key).shape == torchrl_batch.get(key).shape, key
        assert lean.get(key).dtype == torchrl_batch.get(key).dtype, key


def test_observations_are_standardised_with_the_runs_statistics():
    cfg, collector, batch, _ = _batch("sac", "Pendulum-v1", "env.obs_norm=true")
    loc, scale = collector.norm
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=3)
    assert torch.allclose(batch["observation"][0, 0], (torch.as_tensor(obs, dtype=torch.float32) - loc) / scale)
    assert not torch.allclose(loc, torch.zeros_like(loc))


def test_ou_noise_keeps_its_process_across_steps():
    """DDPG's Ornstein-Uhlenbeck noise keeps its state in the tensordict: carried from step to step, the noise is
    strongly autocorrelated (white noise would not be)."""
    _, collector, batch, _ = _batch("ddpg", "Pendulum-v1", "ddpg.noise=ou", "ddpg.sigma=0.5", "ddpg.sigma_end=0.5")
    with torch.no_grad():
        greedy = collector.policy[0](batch[0].select("observation").clone())["action"]
    noise = (batch["action"][0] - greedy).reshape(-1)[:199]  # Pendulum's first episode (200 steps), unclipped part
    lag1 = torch.corrcoef(torch.stack([noise[:-1], noise[1:]]))[0, 1]
    assert lag1 > 0.8


def test_where_the_lean_collector_applies():
    def cfg(*args):
        return compose_config(["algo=dqn", *args])[0]

    assert lean_collection(cfg()) and lean_collection(cfg("env.num_envs=4"))
    assert not lean_collection(cfg("collector.lean=false"))
    assert not lean_collection(cfg("env=Pong"))
    assert not lean_collection(cfg("env.num_envs=4", "env.vector=process"))
    assert not lean_collection(cfg("env.backend=envpool"))
    # each Ray collector actor steps its envs in its own process: lean too, unless its policy runs on a GPU
    assert lean_collection(cfg("engine=ray")) and not lean_collection(cfg("engine=ray", "ray.collector_gpus=0.5"))
    # the training process builds one torchrl copy (specs, observation statistics) unless torchrl's Collector steps all
    local = engine_class("local")
    assert local.training_env_copies(cfg("env.num_envs=4")) == 1
    assert local.training_env_copies(cfg("env.num_envs=4", "collector.lean=false")) == 4
