"""GAE and loss on a worker's rollout, and the optional shuffled minibatches."""
import copy

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement

from a3c.learner import A3CLearner
from shared.models import AtariActorCritic

ENVS, STEPS = 3, 4


def fake_rollout(seed: int, envs: int = ENVS, steps: int = STEPS, channels: int = 2, size: int = 36) -> TensorDict:
    """A rollout with the layout Rollout.collect produces, from random data."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(envs, steps + 1, 1, generator=g)
    dones = torch.rand(envs, steps, 1, generator=g) < 0.2
    return TensorDict({
        "observation": torch.randint(0, 255, (envs, steps, channels, size, size), dtype=torch.uint8, generator=g),
        "action": torch.randint(0, 4, (envs, steps), generator=g),
        "fire_forced": torch.zeros(envs, steps, 1, dtype=torch.bool),
        "state_value": values[:, :steps],
        "next": {"reward": torch.randn(envs, steps, 1, generator=g), "done": dones, "terminated": dones,
                 "state_value": values[:, 1:]},
    }, batch_size=[envs, steps])


def _learner(minibatches=1, lr=0.0, gae_lambda=1.0, entropy_coeff=0.01):
    model = AtariActorCritic(num_actions=4, in_channels=2, image_size=36, arch="small")
    local = copy.deepcopy(model)
    return A3CLearner(local, model, torch.optim.SGD(model.parameters(), lr=lr), gamma=0.9, gae_lambda=gae_lambda,
                      entropy_coeff=entropy_coeff, critic_coeff=0.5, loss_critic_type="l2", max_grad_norm=1e9,
                      rollout_size=ENVS * STEPS, minibatches=minibatches)


def n_step_returns(rollout: TensorDict, gamma: float = 0.9) -> torch.Tensor:
    """``[envs, steps]`` discounted returns to the end of the rollout, bootstrapped from the last next value."""
    r, d = rollout["next", "reward"][..., 0], rollout["next", "done"][..., 0].float()
    returns = torch.zeros(r.shape)
    ret = rollout["next", "state_value"][:, -1, 0]  # bootstrap from the value after the last step
    for t in reversed(range(r.shape[1])):
        ret = r[:, t] + gamma * (1 - d[:, t]) * ret
        returns[:, t] = ret
    return returns


def test_gae_lambda_one_gives_n_step_returns():
    rollout = fake_rollout(0)
    _learner().update(rollout)
    expected = n_step_returns(rollout)
    torch.testing.assert_close(rollout["value_target"][..., 0], expected)
    torch.testing.assert_close(rollout["advantage"][..., 0], expected - rollout["state_value"][..., 0])


def test_minibatches_are_shuffled_by_a_torchrl_buffer_and_cover_the_rollout():
    learner = _learner(minibatches=3, lr=1e-3)
    assert isinstance(learner.shuffler, ReplayBuffer)
    assert isinstance(learner.shuffler.sampler, SamplerWithoutReplacement)
    seen = []
    step = learner._step
    learner._step = lambda batch: (seen.append(batch["state_value"].reshape(-1).clone()), step(batch))[1]
    rollout = fake_rollout(1)
    learner.update(rollout)
    assert len(seen) == 3 and all(len(b) == ENVS * STEPS // 3 for b in seen)
    in_rollout_order = rollout["state_value"].reshape(-1)
    sampled = torch.cat(seen)
    assert sorted(sampled.tolist()) == sorted(in_rollout_order.tolist())  # every transition exactly once
    assert not torch.equal(sampled, in_rollout_order)  # shuffled, not split in order


def test_update_reports_the_losses_of_a_hand_computation():
    """The reported losses, entropy, advantage and gradient norm are A2C's on this rollout, computed by hand from the
    local model before its step: policy term -mean(log pi(a|s) A) with the n-step advantages (lambda 1) zeroed where
    the env forced FIRE after a lost life (the sampled action never ran there), critic 0.5 mean((G - V(s))^2),
    entropy bonus -0.01 mean(H)."""
    from torch.distributions import Categorical

    rollout = fake_rollout(2)
    rollout["fire_forced"][0, 1] = rollout["fire_forced"][2, 3] = True
    learner = _learner(lr=1e-3)
    model = copy.deepcopy(learner.local)
    logits, value = model(rollout["observation"].reshape(-1, 2, 36, 36))
    returns = n_step_returns(rollout)
    advantage = returns - rollout["state_value"][..., 0]
    kept = (advantage * ~rollout["fire_forced"][..., 0]).reshape(-1)
    dist = Categorical(logits=logits)
    log_prob = dist.log_prob(rollout["action"].reshape(-1))
    objective = -(log_prob * kept).mean()
    critic = 0.5 * ((returns.reshape(-1) - value[:, 0]) ** 2).mean()
    entropy = dist.entropy().mean()
    (objective + critic - 0.01 * entropy).backward()
    grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))

    metrics = learner.update(rollout)
    expected = {"loss/objective": objective, "loss/critic": critic, "loss/entropy": -0.01 * entropy,
                "a3c/entropy": entropy, "a3c/advantage": kept.mean(), "a3c/grad_norm": grad_norm}
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value.item(), rel=1e-4, abs=1e-6), name
    unmasked = -(log_prob * advantage.reshape(-1)).mean()
    assert abs((unmasked - objective).item()) > 1e-3  # the forced steps' terms matter on this rollout


def test_zero_entropy_coefficient_updates_without_an_entropy_term():
    """a3c.entropy_coeff=0 is allowed by the config: A2CLoss then has no loss_entropy, and the update must still
    step (it used to die with KeyError: loss_entropy in every worker)."""
    learner = _learner(lr=1e-2, entropy_coeff=0.0)
    before = [p.detach().clone() for p in learner.global_model.parameters()]
    metrics = learner.update(fake_rollout(3))
    assert "loss/entropy" not in metrics and {"loss/objective", "loss/critic"} <= set(metrics)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.global_model.parameters()))


def test_a_game_cut_at_the_frame_cap_bootstraps_from_its_last_observation():
    """ALE ends a game at max_episode_frames (truncation): the rollout marks it done but not terminated, and its
    bootstrap value is V(its last observation) (ALE's final_obs), not V(the next game's first observation)."""
    from a3c.rollout import Rollout
    from shared.atari import AtariBatch, AtariSettings

    torch.manual_seed(0)
    settings = AtariSettings(name="Pong", max_episode_frames=200, image_size=36, frame_stack=2)  # 50 agent steps
    env = AtariBatch(settings, num_envs=2, seed=0)
    model = AtariActorCritic(num_actions=env.num_actions, in_channels=2, image_size=36, arch="small")
    final_obs = []  # per step: ALE's last observations of the games capped there (None where none was)
    play = env.step

    def step(actions):
        result = play(actions)
        final_obs.append(None if result.final_obs is None else result.final_obs.copy())
        return result

    env.step = step
    try:
        batch, finished = Rollout(env, t_max=60).collect(model)
    finally:
        env.close()
    done, terminated = batch["next", "done"][..., 0], batch["next", "terminated"][..., 0]
    cut = done & ~terminated
    assert cut.sum() == 2 and len(finished) == 2  # both games capped (Pong lasts far longer than 50 steps)
    for env_index, t in cut.nonzero().tolist():
        with torch.no_grad():
            last_value = model(torch.from_numpy(final_obs[t][env_index]).unsqueeze(0))[1]
            reset_value = model(batch["observation"][env_index, t + 1].unsqueeze(0))[1]
        torch.testing.assert_close(batch["next", "state_value"][env_index, t], last_value[0])
        assert not torch.allclose(batch["next", "state_value"][env_index, t], reset_value)  # not the next game's start
    env_index, t = cut.nonzero()[0].tolist()
    learner = _learner()
    learner.gae(batch)  # GAE bootstraps there: the advantage uses the capped game's own value
    r, v_next, v = (batch["next", "reward"][env_index, t, 0], batch["next", "state_value"][env_index, t, 0],
                    batch["state_value"][env_index, t, 0])
    torch.testing.assert_close(batch["advantage"][env_index, t, 0], r + 0.9 * v_next - v)


def test_a_forced_fire_is_recorded_as_the_action_the_game_ran():
    """A policy that only ever samples NOOP, in Breakout: after each lost life the env ran FIRE, and the rollout
    records FIRE there, marked ``fire_forced`` (so the update drops that step's policy term), and NOOP everywhere
    else; the game goes on after each relaunch, to its end."""
    from a3c.rollout import Rollout
    from shared.atari import AtariBatch, AtariSettings, atari_rom, fire_action

    env = AtariBatch(AtariSettings(name="Breakout", image_size=36, frame_stack=2), num_envs=2, seed=0)
    model = AtariActorCritic(num_actions=env.num_actions, in_channels=2, image_size=36, arch="small")
    with torch.no_grad():
        model.policy_head.weight.zero_()
        model.policy_head.bias.copy_(torch.tensor([50.0, -50.0, -50.0, -50.0]))  # NOOP, always
    try:
        batch, finished = Rollout(env, t_max=150).collect(model)
    finally:
        env.close()
    forced = batch["fire_forced"][..., 0]
    assert (batch["action"][forced] == fire_action(atari_rom("Breakout"))).all()
    assert (batch["action"][~forced] == 0).all()
    ended = batch["next", "terminated"][..., 0]
    assert not forced[:, 0].any() and ended[:, :-1][forced[:, 1:]].all()  # each one right after a lost life
    assert (forced.sum(1) >= 4).all() and len(finished) == 2  # 4 relaunches per game, and the games ended
