"""Value estimators (loss.value_estimator) and trajectory replay (replay.slice_len): TD(lambda) targets equal a hand
computation on a tiny trajectory and differ from TD(0); sliced samples are contiguous pieces of one trajectory."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from offpolicy import envs
from offpolicy.builder import Builder
from offpolicy.config import compose_config
from offpolicy.replay import make_replay_buffer, sample_shape

GAMMA, LMBDA = 0.9, 0.5


def _ddpg(estimator):
    cfg, _ = compose_config(["algo=ddpg", "env=Pendulum-v1", "profile=smoke", f"loss.value_estimator={estimator}",
                             f"loss.gamma={GAMMA}", f"loss.lmbda={LMBDA}", "replay.slice_len=4"])
    torch.manual_seed(0)
    return Builder(cfg).parts(envs.make_train_env(cfg))


def _trajectory(steps=4):
    """One trajectory [1, steps] of Pendulum-shaped transitions; the last one is truncated (bootstrapped)."""
    torch.manual_seed(1)
    obs = torch.randn(1, steps + 1, 3)
    done = torch.zeros(1, steps, 1, dtype=torch.bool)
    truncated = done.clone()
    truncated[:, -1] = True
    return TensorDict({
        "observation": obs[:, :-1], "action": torch.rand(1, steps, 1) * 4 - 2,
        "next": {"observation": obs[:, 1:], "reward": torch.randn(1, steps, 1), "done": truncated.clone(),
                 "terminated": done, "truncated": truncated},
    }, batch_size=[1, steps])


def _targets(parts, td):
    loss = parts.loss
    return loss.value_estimator.value_estimate(td.clone(), target_params=loss._cached_target_params).squeeze()


def test_td_lambda_matches_hand_computation_and_differs_from_td0():
    td = _trajectory()
    lam_parts, td0_parts = _ddpg("tdlambda"), _ddpg("td0")
    # targets start as copies of the online networks: V(s') = Q(s', mu(s'))
    with torch.no_grad():
        nxt = td["next"].select("observation").clone()
        v_next = lam_parts.loss.value_network(lam_parts.loss.actor_network(nxt))["state_action_value"].squeeze()
    reward = td["next", "reward"].squeeze()
    hand = torch.zeros(4)
    hand[3] = reward[3] + GAMMA * v_next[3]  # truncated: bootstrap from V(s'_T)
    for t in (2, 1, 0):
        hand[t] = reward[t] + GAMMA * ((1 - LMBDA) * v_next[t] + LMBDA * hand[t + 1])
    lam = _targets(lam_parts, td)
    assert torch.allclose(lam, hand, atol=1e-5), (lam, hand)
    td0 = _targets(td0_parts, td)
    assert torch.allclose(td0, reward + GAMMA * v_next, atol=1e-5)
    assert not torch.allclose(lam[:3], td0[:3], atol=1e-3)  # TD(lambda) looks further along the trajectory


def test_terminal_step_does_not_bootstrap():
    td = _trajectory()
    td["next", "terminated"][:, 1] = True
    td["next", "done"][:, 1] = True
    lam = _targets(_ddpg("tdlambda"), td)
    assert lam[1] == pytest.approx(float(td["next", "reward"][0, 1]), abs=1e-5)


def test_value_estimators_need_trajectory_replay():
    from shared.config import ConfigError

    with pytest.raises(ConfigError, match="replay.slice_len"):
        compose_config(["algo=sac", "loss.value_estimator=td1"])
    with pytest.raises(ConfigError, match="divisor"):
        compose_config(["algo=sac", "replay.slice_len=7"])


def test_slices_are_contiguous_pieces_of_one_trajectory():
    cfg, _ = compose_config(["algo=sac", "env=Pendulum-v1", "profile=smoke", "replay.slice_len=8",
                             "collector.env_steps_per_batch=400", "env.num_envs=2"])
    torch.manual_seed(0)
    env = envs.make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    replay = make_replay_buffer(cfg)
    try:
        replay.extend(next(iter(collector)).reshape(-1))
    finally:
        collector.shutdown()
    sample = replay.sample(cfg.optim.batch_size).reshape(sample_shape(cfg))  # as the learner draws it
    assert sample.batch_size == torch.Size(sample_shape(cfg)) == torch.Size([4, 8])
    traj = sample["collector", "traj_ids"]
    assert (traj == traj[:, :1]).all()  # one trajectory per slice
    steps = sample["step_count"].squeeze(-1)
    assert (steps[:, 1:] - steps[:, :-1] == 1).all()  # consecutive steps
    assert sample["next", "truncated"][:, -1].all()  # the estimator bootstraps at each slice's end
    assert torch.equal(sample["next", "observation"][:, :-1], sample["observation"][:, 1:])
