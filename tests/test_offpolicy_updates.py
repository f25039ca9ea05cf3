"""Optimiser and target-network options: per-network optimisers (learning rate, weight decay, gradient clip), TD3's
delayed actor + target updates, soft and hard target updates (a hard copy exactly every K updates)."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import smoke_parts
from omegaconf import OmegaConf

from offpolicy.algos import ALGORITHMS, ALGOS
from offpolicy.builder import Builder
from offpolicy.learner import make_learner
from offpolicy.config import compose_config
from offpolicy.envs import make_train_env
from offpolicy.replay import sample_shape


def _parts(algo, *overrides):
    cfg, _, parts, batch = smoke_parts(algo, *overrides)
    return cfg, parts, batch


def _learner(cfg, parts):
    return make_learner(cfg, parts, None if parts.discrete else _action_spec(cfg), sample_shape=sample_shape(cfg))


def _action_spec(cfg):
    return make_train_env(cfg).action_spec_unbatched


def _flat(params):
    return torch.cat([p.detach().reshape(-1).clone() for p in params.flatten_keys().values()])


def test_actor_and_critic_have_their_own_optimisers():
    _, parts, _ = _parts("ddpg", "optim.lr=1e-4", "optim.critic_lr=1e-3", "optim.critic_weight_decay=0.01")
    actor, critic = parts.optimizers["actor"], parts.optimizers["critic"]
    assert actor is not critic
    assert actor.param_groups[0]["lr"] == 1e-4 and actor.param_groups[0]["weight_decay"] == 0.0
    assert critic.param_groups[0]["lr"] == 1e-3 and critic.param_groups[0]["weight_decay"] == 0.01
    actor_ids = {id(p) for p in actor.param_groups[0]["params"]}
    critic_ids = {id(p) for p in critic.param_groups[0]["params"]}
    assert actor_ids and critic_ids and not actor_ids & critic_ids
    assert {id(p) for p in parts.loss.actor_network_params.flatten_keys().values()} == actor_ids


def test_each_optimiser_clips_its_own_gradients():
    cfg, parts, batch = _parts("sac", "optim.critic_max_grad_norm=0.001")
    norms = {}
    for name, opt in parts.optimizers.items():
        def record(optimizer, args, kwargs, name=name):
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            norms[name] = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        opt.register_step_pre_hook(record)
    out = _learner(cfg, parts).step(batch[:32].clone())
    assert norms["critic"] == pytest.approx(0.001, rel=1e-3)  # clipped to its own norm
    assert float(out["grad_norm_critic"]) > 0.01  # the logged norm is the one before clipping
    assert norms["actor"] > 0.001 and norms["actor"] == pytest.approx(float(out["grad_norm_actor"]), rel=1e-4)


def test_td3_updates_actor_and_targets_every_policy_delay_steps():
    cfg, parts, batch = _parts("td3", "td3.policy_delay=2", "target.tau=0.5")
    loss, learner = parts.loss, _learner(cfg, parts)
    replay = _OneBatch(batch[:32])

    def snapshot():
        return (_flat(loss.actor_network_params), _flat(loss.qvalue_network_params),
                _flat(loss.target_actor_network_params), _flat(loss.target_qvalue_network_params))

    before = snapshot()
    learner.update(replay, 1, version=1)
    after_first = snapshot()
    assert torch.equal(before[0], after_first[0])  # step 1: actor not updated
    assert not torch.equal(before[1], after_first[1])  # critic updated
    assert torch.equal(before[2], after_first[2]) and torch.equal(before[3], after_first[3])  # targets untouched
    learner.update(replay, 1, version=1)
    after_second = snapshot()
    assert not torch.equal(after_first[0], after_second[0])  # step 2: actor updated...
    # ...and both targets moved halfway (tau 0.5) towards the online networks
    assert torch.allclose(after_second[2], 0.5 * after_first[2] + 0.5 * after_second[0], atol=1e-6)
    assert torch.allclose(after_second[3], 0.5 * after_first[3] + 0.5 * after_second[1], atol=1e-6)
    assert parts.target_updater.updates == 1


class _OneBatch:
    """A replay buffer that always returns (a copy of) the same batch."""

    def __init__(self, batch):
        self.batch = batch

    def sample(self, n):
        assert n == self.batch.numel()
        return self.batch.clone()


@pytest.mark.parametrize("algo", ["dqn", "ddpg"])
def test_hard_update_copies_exactly_every_k_updates(algo):
    _, parts, _ = _parts(algo, "target.mode=hard", "target.hard_every=3")
    loss, updater = parts.loss, parts.target_updater
    updater.init_()
    online, target = loss.value_network_params, loss.target_value_network_params  # DQN's Q net, DDPG's critic
    copies = []
    for step in range(1, 10):
        with torch.no_grad():
            for p in online.flatten_keys().values():
                p.add_(0.1)  # an optimiser step
        updater.step()
        copies.append(torch.equal(_flat(online), _flat(target)))
    assert copies == [False, False, True] * 3


def test_soft_update_moves_tau_of_the_way():
    _, parts, _ = _parts("sac", "target.tau=0.1")
    loss, updater = parts.loss, parts.target_updater
    updater.init_()
    with torch.no_grad():
        for p in loss.qvalue_network_params.flatten_keys().values():
            p.add_(1.0)
    old_target = _flat(loss.target_qvalue_network_params)
    updater.step()
    expected = 0.9 * old_target + 0.1 * _flat(loss.qvalue_network_params)
    assert torch.allclose(_flat(loss.target_qvalue_network_params), expected, atol=1e-6)


def test_td3_target_smoothing_noise_is_scaled_to_the_action_range():
    """Humanoid-v5's actions span [-0.4, 0.4]: sigma 0.2 clipped at 0.5 means 0.08 clipped at 0.2 (TD3 paper), not
    0.2 clipped at 0.5 in absolute units (half the range)."""
    cfg, _ = compose_config(["algo=td3", "env=Humanoid-v5", "profile=smoke"])
    env = make_train_env(cfg)
    try:
        loss = Builder(cfg).parts(env).loss
    finally:
        env.close()
    assert loss.policy_noise.shape == loss.noise_clip.shape == (17,)
    assert torch.allclose(loss.policy_noise, torch.tensor(0.08)) and torch.allclose(loss.noise_clip, torch.tensor(0.2))


def test_td3_target_smoothing_noise_is_per_action_dimension():
    """Action dimensions of ranges [-1, 1] and [-10, 10]: the noise added to the target policy's action is 0.2 x each
    dimension's half range (std 0.2 and 2) clipped at 0.5 x it (0.5 and 5), as the exploration noise is per
    dimension; one scalar from the mean half range (1.1 clipped at 2.75) swamps the narrow dimension. The scales are
    buffers, so they follow the loss to its device, and stay out of its checkpointed state."""
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.data import Bounded
    from torchrl.modules import ValueOperator

    from offpolicy.algos.td3 import make_loss

    cfg, _ = compose_config(["algo=td3", "env=Pendulum-v1", "profile=smoke"])
    half_range = torch.tensor([1.0, 10.0])
    spec = Bounded(low=-half_range, high=half_range, shape=(2,))
    actor = TensorDictModule(nn.Linear(1, 2), in_keys=["observation"], out_keys=["action"])
    nn.init.zeros_(actor.module.weight)
    nn.init.zeros_(actor.module.bias)  # the target action before smoothing is 0: what the critic sees is the noise
    next_actions = []

    class Critic(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(3, 1)

        def forward(self, observation, action):
            if (observation == 1).all():  # the target pass (next observations are 1, current ones 0)
                next_actions.append(action.detach().clone())
            return self.net(torch.cat([observation, action], -1))

    loss = make_loss(cfg, actor, ValueOperator(Critic(), in_keys=["observation", "action"]), spec)
    n = 20_000
    done = torch.zeros(n, 1, dtype=torch.bool)
    batch = TensorDict({"observation": torch.zeros(n, 1), "action": torch.zeros(n, 2),
                        "next": {"observation": torch.ones(n, 1), "reward": torch.zeros(n, 1), "done": done,
                                 "terminated": done.clone()}}, [n])
    torch.manual_seed(0)
    loss.value_loss(batch)
    noise = next_actions[0]
    assert torch.equal(noise.abs().amax(0), cfg.td3.noise_clip * half_range)  # clipped per dimension, and reached
    assert torch.allclose(noise.std(0) / half_range, torch.tensor(cfg.td3.target_noise), rtol=0.05)
    assert {"policy_noise", "noise_clip"} <= {name for name, _ in loss.named_buffers()}
    assert not {"policy_noise", "noise_clip"} & set(loss.state_dict())


@pytest.mark.parametrize("algo", [a for a in ALGOS if ALGORITHMS[a].priority == "td_error"])
def test_priorities_are_abs_td_error_for_every_algorithm(algo):
    """With every Q network zero (and an entropy temperature ~0), the TD error of a transition is its reward: each
    algorithm must give it the priority (|r| + eps)^alpha (Schaul et al.), not r^2 (torchrl's DQN, DDPG and TD3
    losses write the squared error)."""
    from offpolicy.replay import make_replay_buffer

    temperature = [f"{algo}.alpha_init=1e-9", f"{algo}.fixed_alpha=true"]
    has_temperature = OmegaConf.select(compose_config([f"algo={algo}"])[0], f"{algo}.alpha_init") is not None
    cfg, parts, batch = _parts(algo, "replay.prioritized=true", "replay.alpha=0.5",
                               *(temperature if has_temperature else []))
    # every network but the actor (and its target): the Q networks, their targets, CrossQ's normalisation
    for name, params in parts.loss.named_children():
        if name.endswith("network_params") and "actor" not in name:
            for p in params.flatten_keys().values():
                p.data.zero_()
    learner = _learner(cfg, parts)
    replay = make_replay_buffer(cfg)
    batch["next", "reward"] = torch.linspace(0.5, 3.0, batch.numel()).reshape(batch["next", "reward"].shape)
    batch["next", "terminated"].zero_()
    batch["next", "done"].zero_()
    replay.extend(batch)
    sample = replay.sample(cfg.optim.batch_size)
    learner.step(sample)
    learner.write_priorities(replay, sample)
    sum_tree, _ = replay.sampler.trees()
    reward = sample["next", "reward"].reshape(-1).double()
    assert torch.allclose(sum_tree.values[sample["index"]], (reward + 1e-8) ** 0.5, rtol=1e-4)
