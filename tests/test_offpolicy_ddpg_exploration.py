"""DDPG with an exploration module: the collector runs actor + noise (action std about sigma = 0.2 around the
deterministic action), while the loss and the evaluator use the deterministic actor (std 0), and weight
publication works with that collector policy."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from offpolicy.config import compose_config
from offpolicy.builder import Builder
from offpolicy.engines.local import LocalEngine
from offpolicy.envs import make_train_env


def _build(tmp_path, *overrides, algo="ddpg"):
    cfg, _ = compose_config([f"algo={algo}", "env=HalfCheetah-v5", "profile=smoke", "collector.env_steps_per_batch=500",
                             *overrides])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    engine = LocalEngine(Builder(cfg), env, parts, tmp_path, cfg.seed)
    return cfg, parts, engine.collector, engine


def _deterministic(policy, batch):
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return policy(batch.select("observation").clone())["action"]


def test_collection_is_noisy_and_evaluation_deterministic(tmp_path):
    cfg, parts, collector, engine = _build(tmp_path)
    try:
        batch = next(iter(collector))
        noise = batch["action"] - _deterministic(parts.eval_policy, batch)
        # HalfCheetah's actions span [-1, 1], so sigma 0.2 (half-range units) is a std of 0.2 per dimension
        assert abs(float(noise.std()) - 0.2) < 0.03, float(noise.std())
        assert abs(float(noise.mean())) < 0.03
        # the evaluator's and the loss's actor are deterministic: the same observations give the same actions
        first, second = _deterministic(parts.eval_policy, batch), _deterministic(parts.eval_policy, batch)
        assert float((first - second).std()) == 0.0
        assert parts.loss.actor_network is parts.eval_policy
        # the collection policy is actor + noise; under deterministic exploration it equals the actor
        assert torch.equal(_deterministic(parts.collect_policy, batch), first)
    finally:
        collector.shutdown()


@pytest.mark.parametrize("lean", [True, False])
def test_publishing_versions_the_next_batch_and_it_uses_the_new_actor_and_noise(tmp_path, lean):
    """The local collector (ours or torchrl's) runs the learner's own actor and noise modules, so there are no weights
    to copy: what publishing does is bump the policy version, which every transition collected afterwards carries
    (the learner and the round invariants check it). The learner's changes act on the very next batch."""
    cfg, parts, collector, engine = _build(tmp_path, f"collector.lean={str(lean).lower()}")
    try:
        first = next(iter(collector))
        assert (first["next", "policy_version"] == 0).all()
        with torch.no_grad():  # change the learner's actor and noise, then publish as the loop does after a batch
            for p in parts.eval_policy.parameters():
                p.add_(0.5)
            parts.exploration.sigma.fill_(0.05)
        assert engine.publish() == 1 == collector.policy_version
        batch = next(iter(collector))
        assert (batch["next", "policy_version"] == 1).all()
        noise = batch["action"] - _deterministic(parts.eval_policy, batch)  # around the changed actor
        assert float(noise.std()) < 0.08  # explores with the new sigma 0.05
        assert engine.publish() == 2 and (next(iter(collector))["next", "policy_version"] == 2).all()
    finally:
        collector.shutdown()


@pytest.mark.parametrize("lean", [True, False])
def test_td3_prefills_with_uniform_actions_then_acts_with_its_noisy_actor(tmp_path, lean):
    """TD3's ``td3.random_prefill`` (its default): the prefill's batches are drawn uniformly in the action bounds
    (HalfCheetah's [-1, 1]: std 1/sqrt(3) = 0.577), by our collector and torchrl's alike, whatever the actor says; the
    count is of whole batches, taken down as the loop anneals after each. Once it has counted the prefill's env
    steps, the next batch is the noisy actor's (std 0.1 around the deterministic action). The count is a buffer of
    the collection policy, so the weights published to Ray's collectors and the overlap child carry it."""
    from offpolicy.algos.base import anneal

    cfg, parts, collector, engine = _build(tmp_path, f"collector.lean={str(lean).lower()}", algo="td3")
    try:
        assert cfg.td3.random_prefill and int(parts.exploration.random_env_steps_left) == 200  # the smoke prefill
        published = TensorDict.from_module(parts.collect_policy).keys(include_nested=True, leaves_only=True)
        assert any(key[-1] == "random_env_steps_left" for key in published)
        first = next(iter(collector))
        action = first["action"]
        assert float(action.std()) == pytest.approx(3 ** -0.5, abs=0.02) and abs(float(action.mean())) < 0.03
        assert float(action.min()) < -0.98 and float(action.max()) > 0.98 and float(action.abs().max()) <= 1.0
        assert float((action - _deterministic(parts.eval_policy, first)).std()) > 0.4
        anneal(parts.exploration, first.numel())  # as the loop does after the batch: 500 steps > the 200 left
        assert int(parts.exploration.random_env_steps_left) == 0
        engine.publish()
        second = next(iter(collector))
        noise = second["action"] - _deterministic(parts.eval_policy, second)
        inside = (_deterministic(parts.eval_policy, second).abs() < 0.7).all(-1)  # where the bounds cut no noise
        assert float(noise[inside].std()) == pytest.approx(0.1, abs=0.02)
    finally:
        collector.shutdown()


def test_ornstein_uhlenbeck_noise_follows_its_process():
    """ddpg.noise=ou: the collection noise is torchrl's OU process x' = x (1 - theta dt) + sigma sqrt(dt) N(0, 1)
    with sigma = ddpg.sigma x half the action range, started at 0: its lag-1 autocorrelation is 1 - theta dt and its
    variance after t steps sigma^2 dt (1 - a^(2t)) / (1 - a^2), a = 1 - theta dt (measured over 2,000 independent
    processes; sigma 0.05 keeps the actions inside HalfCheetah's [-1, 1] bounds, so no clipping)."""
    cfg, _ = compose_config(["algo=ddpg", "env=HalfCheetah-v5", "profile=smoke", "ddpg.noise=ou", "ddpg.sigma=0.05",
                             "ddpg.sigma_end=0.05"])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    env.close()
    ou, steps, n = parts.exploration, 600, 2000
    theta, dt, sigma = 0.15, 1e-2, 0.05  # torchrl's theta and dt; half of HalfCheetah's range is 1
    td = TensorDict({"action": torch.zeros(n, 6), "is_init": torch.ones(n, 1, dtype=torch.bool)}, [n])
    noise = []
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        for t in range(steps):
            td.set("action", torch.zeros(n, 6))
            td = ou(td)
            td.set("is_init", torch.zeros(n, 1, dtype=torch.bool))
            noise.append(td["action"].clone())
    x = torch.stack(noise)  # [steps, n, 6]
    a = 1 - theta * dt
    lag1 = float((x[1:] * x[:-1]).sum() / (x[:-1] ** 2).sum())
    assert lag1 == pytest.approx(a, abs=5e-4)
    expected_var = sigma**2 * dt * (1 - a ** (2 * steps)) / (1 - a**2)
    assert float(x[-1].var()) == pytest.approx(expected_var, rel=0.08)
    assert x.abs().max() < 0.9  # never clipped by the bounds


def test_no_exploration_module(tmp_path):
    cfg, parts, collector, engine = _build(tmp_path, "ddpg.noise=none")
    try:
        assert parts.exploration is None
        batch = next(iter(collector))
        # float32 tolerance: acting one observation at a time and this batch of 500 round differently (1e-7)
        torch.testing.assert_close(batch["action"], _deterministic(parts.eval_policy, batch))
        assert engine.publish() == 1 == collector.policy_version
    finally:
        collector.shutdown()
