"""The local lean collector (offpolicy/collect/lean.py) against the env itself and against torchrl's Collector: every
recorded transition is the env's own (replayed step by step in an independent Gymnasium env from the same seed), the
final observation of an episode is its real last one, the episode statistics and trajectory ids follow the episodes,
and a batch has the keys, shapes and dtypes of the Collector's batch."""
from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from offpolicy.builder import Builder
from offpolicy.collect.lean import LeanCollector, lean_collection
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


@pytest.mark.parametrize("algo, env_name, copies", [("dqn", "CartPole-v1", 1), ("sac", "Pendulum-v1", 1),
                                                    ("dqn", "CartPole-v1", 4)])
def test_every_transition_is_the_envs_own(algo, env_name, copies):
    """Replay each copy's recorded actions in a fresh Gymnasium env from its seed: observations, rewards,
    terminations, truncations, final observations, step counts and episode returns match step for step, across
    episode ends and across two batches (the batch's bookkeeping is computed at its end, from what it carried)."""
    cfg, collector, first, second = _batch(algo, env_name, f"env.num_envs={copies}")  # 400 steps a batch
    assert isinstance(collector, LeanCollector)
    both = torch.cat([first, second], dim=1)  # [copies, 2 x 400 / copies]
    episode_ids = []
    for copy in range(copies):
        batch = both[copy]
        env = gym.make(env_name)
        obs, _ = env.reset(seed=3 + copy)
        episodes, length, total = 0, 0, 0.0
        for t in range(batch.shape[0]):
            assert torch.allclose(batch["observation"][t], torch.as_tensor(obs, dtype=torch.float32))
            assert bool(batch["is_init"][t]) == (length == 0)
            assert int(batch["step_count"][t]) == length
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
        assert episodes >= 3  # random-policy CartPole episodes end often; Pendulum is truncated every 200 steps
        ids = batch["collector", "traj_ids"]
        starts = batch["is_init"].reshape(-1)
        assert torch.equal(ids[1:] != ids[:-1], starts[1:])  # a new trajectory id exactly where an episode starts
        episode_ids += ids.unique().tolist()
    assert len(episode_ids) == len(set(episode_ids))  # no two episodes of any copies share an id
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
    ray = engine_class("ray")
    on_ray = cfg("engine=ray"), cfg("engine=ray", "ray.collector_gpus=0.5")
    assert [lean_collection(c, ray.collects_on_cpu(c)) for c in on_ray] == [True, False]
    # the training process builds one torchrl copy (specs, observation statistics) unless torchrl's Collector steps all
    local = engine_class("local")
    assert local.training_env_copies(cfg("env.num_envs=4")) == 1
    assert local.training_env_copies(cfg("env.num_envs=4", "collector.lean=false")) == 4


def _dqn_policy(eps: float, n_envs: int = 4):
    from offpolicy.algos.base import ActsOnTensors

    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", f"env.num_envs={n_envs}"])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    policy = Builder(cfg).parts(env).collect_policy
    env.close()
    assert isinstance(policy, ActsOnTensors)
    policy[1].eps.fill_(eps)  # the EGreedyModule's epsilon
    return policy


def test_dqns_tensor_policy_is_its_tensordict_policy():
    """Greedy (epsilon 0): ``act`` gives the TensorDict path's one-hot actions, same dtype; epsilon 1: uniform random
    actions without running the network; epsilon 0.3: 0.3 x (1 - 1/2) of the actions differ from the greedy ones."""
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    policy = _dqn_policy(eps=0.0)
    obs = torch.randn(4000, 4) * 2
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        expected = policy(TensorDict({"observation": obs}, [4000]))["action"]
        greedy = policy.act(obs)
        assert greedy.dtype == expected.dtype and torch.equal(greedy, expected)
        assert 0.05 < float(greedy[:, 0].float().mean()) < 0.95  # a network that does not pick one action only

        forwards = []
        network = policy[0].module[0].module
        handle = network.register_forward_hook(lambda *_: forwards.append(1))
        policy[1].eps.fill_(1.0)
        random = policy.act(obs)
        assert not forwards and float(random[:, 0].float().mean()) == pytest.approx(0.5, abs=0.03)
        assert torch.equal(random.sum(-1), torch.ones(4000, dtype=torch.int64))  # one-hot
        policy[1].eps.fill_(0.3)
        mixed = policy.act(obs)
        handle.remove()
        assert forwards  # some copies were greedy
        assert float((mixed != greedy).any(-1).float().mean()) == pytest.approx(0.15, abs=0.02)


def test_the_lean_collector_acts_on_tensors_where_the_policy_can():
    """DQN's lean collection never calls the TensorDict policy; SAC's (no tensor path) does."""
    calls = []
    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", "collector.env_steps_per_batch=50"])
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    handle = parts.collect_policy.register_forward_hook(lambda *_: calls.append(1))
    collector = Builder(cfg).collector(env, parts.collect_policy)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
        handle.remove()
    assert batch.shape == torch.Size([1, 50]) and not calls
    assert torch.equal(batch["action"].sum(-1), torch.ones(1, 50, dtype=torch.int64))


def _policy(algo, *overrides):
    cfg, _ = compose_config([f"algo={algo}", "env=HalfCheetah-v5", "profile=smoke", *overrides])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    env.close()
    return parts


@pytest.mark.parametrize("algo", ["td3", "ddpg"])
def test_gaussian_noise_policys_tensor_path_is_its_tensordict_path(algo):
    """During a uniform prefill both paths draw the same uniform actions; then without noise (sigma 0) ``act`` is the
    TensorDict path's action; with sigma 0.1 (half-range units; HalfCheetah's
    half range is 1) the noise has std 0.1 around it, and every action stays inside the bounds."""
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    from offpolicy.algos.base import ActsOnTensors

    parts = _policy(algo, f"{algo}.noise=gaussian", f"{algo}.random_prefill=true")
    policy = parts.collect_policy
    assert isinstance(policy, ActsOnTensors)
    obs = torch.randn(4000, 17)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        # the uniform prefill (the smoke profile's 200 env steps): the same draws on both paths
        assert int(parts.exploration.random_env_steps_left) == 200
        torch.manual_seed(1)
        uniform = policy.act(obs)
        torch.manual_seed(1)
        assert torch.equal(policy(TensorDict({"observation": obs}, [4000]))["action"], uniform)
        assert float(uniform.std()) == pytest.approx(3 ** -0.5, abs=0.01) and float(uniform.abs().max()) <= 1.0
        parts.exploration.random_env_steps_left.zero_()
        parts.exploration.sigma.fill_(0.0)
        expected = policy(TensorDict({"observation": obs}, [4000]))["action"]
        assert torch.allclose(policy.act(obs), expected, atol=1e-6)
        parts.exploration.sigma.fill_(0.1)
        noisy = policy.act(obs)
    inside = (expected.abs() < 0.7).all(-1)  # away from the bounds, where projection does not cut the noise
    assert float((noisy - expected)[inside].std()) == pytest.approx(0.1, abs=0.01)
    assert float(noisy.abs().max()) <= 1.0


def test_ou_noise_keeps_the_tensordict_path():
    from offpolicy.algos.base import ActsOnTensors

    assert not isinstance(_policy("ddpg", "ddpg.noise=ou").collect_policy, ActsOnTensors)


def test_tanh_normal_policys_tensor_path_samples_its_tensordict_paths_distribution():
    """SAC's ``act`` draws from the distribution its TensorDict path draws from: for one observation repeated, the
    two sets of samples have the same mean and spread per dimension, inside the bounds."""
    from tensordict import TensorDict
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    policy = _policy("sac").collect_policy
    for p in policy.parameters():  # a policy away from the untrained near-uniform one
        p.data.normal_(0, 0.3)
    obs = torch.randn(1, 17).expand(200_000, 17)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        expected = policy(TensorDict({"observation": obs}, [200_000]))["action"]
        sampled = policy.act(obs)
    assert sampled.shape == expected.shape == (200_000, 6)
    assert torch.allclose(sampled.mean(0), expected.mean(0), atol=0.01)  # 4 standard errors
    assert torch.allclose(sampled.std(0), expected.std(0), atol=0.01)
    assert float(sampled.abs().max()) <= 1.0 and float(expected.std(0).max()) > 0.5  # a stochastic policy


def test_chained_forward_is_the_networks_forward_and_keeps_hooks():
    """The layers' forwards in turn give the network's output (MLP, a nested chain with an Identity and a dueling
    head); a network with a forward hook is returned as it is, so its hook still runs."""
    from torch import nn

    from shared.models import DuelingHead, ReLU, chained_forward, mlp

    torch.manual_seed(0)
    x = torch.randn(5, 4)
    nested = nn.Sequential(nn.Identity(), nn.Sequential(mlp(4, 8, (16,)), ReLU()), DuelingHead(8, 3, 16, ReLU))
    for net in (mlp(4, 2, (120, 84)), nested):
        forward = chained_forward(net)
        assert forward is not net and torch.equal(forward(x), net(x))
    calls = []
    handle = nested[2].register_forward_hook(lambda *_: calls.append(1))
    assert chained_forward(nested) is nested
    chained_forward(nested)(x)
    handle.remove()
    assert calls == [1]
