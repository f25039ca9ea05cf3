"""GAE and loss on a worker's rollout, and the optional shuffled minibatches."""
import copy

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


def test_gae_lambda_one_gives_n_step_returns():
    rollout = fake_rollout(0)
    _learner().update(rollout)
    r, d = rollout["next", "reward"][..., 0], rollout["next", "done"][..., 0].float()
    v, v_next = rollout["state_value"][..., 0], rollout["next", "state_value"][..., 0]
    expected = torch.zeros(ENVS, STEPS)
    ret = v_next[:, -1]  # bootstrap from the value after the last step
    for t in reversed(range(STEPS)):
        ret = r[:, t] + 0.9 * (1 - d[:, t]) * ret
        expected[:, t] = ret
    torch.testing.assert_close(rollout["value_target"][..., 0], expected)
    torch.testing.assert_close(rollout["advantage"][..., 0], expected - v)


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


def test_update_reports_finite_losses():
    metrics = _learner(lr=1e-3).update(fake_rollout(2))
    assert set(metrics) >= {"loss/objective", "loss/critic", "loss/entropy", "a3c/grad_norm"}
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


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
    try:
        batch, finished = Rollout(env, t_max=60).collect(model)
    finally:
        env.close()
    done, terminated = batch["next", "done"][..., 0], batch["next", "terminated"][..., 0]
    cut = done & ~terminated
    assert cut.sum() == 2 and len(finished) == 2  # both games capped (Pong lasts far longer than 50 steps)
    env_index, t = cut.nonzero()[0].tolist()
    with torch.no_grad():
        reset_value = model(batch["observation"][env_index, t + 1].unsqueeze(0))[1]
    assert not torch.allclose(batch["next", "state_value"][env_index, t], reset_value)  # not the next game's start
    learner = _learner()
    learner.gae(batch)  # GAE bootstraps there: the advantage uses the capped game's own value
    r, v_next, v = (batch["next", "reward"][env_index, t, 0], batch["next", "state_value"][env_index, t, 0],
                    batch["state_value"][env_index, t, 0])
    torch.testing.assert_close(batch["advantage"][env_index, t, 0], r + 0.9 * v_next - v)
