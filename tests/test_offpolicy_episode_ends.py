"""Terminations and truncations in one env: CartPole with a 20-step limit (a random policy's episodes often fail
before it, the others are cut at 20). Through the real path (the lean collector, the local engine's replay writes with
3-step windows, its round statistics), checked against the same env stepped here by hand: the stored flags and
windows, the value targets (a truncation bootstraps, a termination does not), episode returns and lengths, ``is_init``
and trajectory ids."""
from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from offpolicy_helpers import window_length

from offpolicy.builder import Builder
from offpolicy.collect.lean import LeanCollector
from offpolicy.config import compose_config
from offpolicy.engines import engine_class

LIMIT, COPIES, STEPS, ROUNDS, N, GAMMA, SEED = 20, 2, 60, 2, 3, 0.9, 3
SHORT_CARTPOLE = "CartPole20-v0"
if SHORT_CARTPOLE not in gym.registry:
    gym.register(SHORT_CARTPOLE, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
                 max_episode_steps=LIMIT)


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """Two rounds of the local engine (2 copies, 60 steps each per round): its rollouts and the replay's rows in
    write order (round by round, copy by copy), and the DQN parts (their value estimator)."""
    cfg, _ = compose_config(["algo=dqn", f"env={SHORT_CARTPOLE}", "profile=smoke", f"env.num_envs={COPIES}",
                             f"collector.env_steps_per_batch={COPIES * STEPS}", f"loss.n_steps={N}",
                             f"loss.gamma={GAMMA}", "replay.size=1000", f"seed={SEED}"])
    torch.manual_seed(0)
    builder = Builder(cfg)
    env = builder.train_env(num_envs=engine_class("local").training_env_copies(cfg))
    parts = builder.parts(env)
    engine = engine_class("local")(builder, env, parts, tmp_path_factory.mktemp("run"), SEED)
    assert isinstance(engine.collector, LeanCollector)
    try:
        rollouts = [engine.collect() for _ in range(ROUNDS)]
        rows = engine.replay.storage.get(torch.arange(len(engine.replay)))
    finally:
        engine.close()
    assert len(rows) == ROUNDS * COPIES * STEPS
    return rollouts, rows.reshape(ROUNDS, COPIES, STEPS), parts


def _hand_steps(rows, copy: int) -> list[dict]:
    """The copy's steps, replayed here with its stored actions in a fresh env from its seed."""
    env = gym.make(SHORT_CARTPOLE)
    obs, _ = env.reset(seed=SEED + copy)
    steps, length, total = [], 0, 0.0
    for action in rows[:, copy]["action"].argmax(-1).reshape(-1).tolist():
        first = length == 0
        next_obs, reward, terminated, truncated, _ = env.step(action)
        length, total = length + 1, total + reward
        steps.append({"obs": obs, "next": next_obs, "reward": reward, "terminated": terminated,
                      "truncated": truncated, "first": first, "length": length, "return": total})
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
            length, total = 0, 0.0
    return steps


def test_both_kinds_of_end_happen(collected):
    _, rows, _ = collected
    steps = [s for copy in range(COPIES) for s in _hand_steps(rows, copy)]
    failed = [s for s in steps if s["terminated"] and not s["truncated"]]
    cut = [s for s in steps if s["truncated"] and not s["terminated"]]
    assert len(failed) >= 3 and len(cut) >= 3, (len(failed), len(cut))
    assert all(s["length"] < LIMIT for s in failed) and all(s["length"] == LIMIT for s in cut)


def test_stored_windows_and_flags_are_the_envs(collected):
    """Every stored 3-step window, against the hand-stepped env: it stops after a terminated or truncated step and at
    its round's end; its reward is the discounted sum, its next observation the real one after its last step (a
    finished episode's final observation), its flags that step's."""
    _, rows, _ = collected
    for copy in range(COPIES):
        steps = _hand_steps(rows, copy)
        for r in range(ROUNDS):
            span, stored = steps[r * STEPS:(r + 1) * STEPS], rows[r, copy]
            ended = [s["terminated"] or s["truncated"] for s in span]
            for t, step in enumerate(span):
                k = window_length(ended, t, N)
                last, row = span[t + k - 1], stored[t]
                assert torch.allclose(row["observation"], torch.as_tensor(step["obs"], dtype=torch.float32))
                assert int(row["steps_to_next_obs"]) == k, (copy, r, t)
                assert float(row["next", "reward"]) == pytest.approx(sum(GAMMA ** i * span[t + i]["reward"]
                                                                         for i in range(k)))
                assert torch.allclose(row["next", "observation"], torch.as_tensor(last["next"], dtype=torch.float32))
                assert (bool(row["next", "terminated"]), bool(row["next", "truncated"]), bool(row["next", "done"])) \
                    == (last["terminated"], last["truncated"], last["terminated"] or last["truncated"]), (copy, r, t)
                assert bool(row["is_init"]) == step["first"], (copy, r, t)


def test_targets_bootstrap_on_truncation_and_not_on_termination(collected):
    """DQN's TD(0) estimator on the stored windows, with every next value 10: R + 0.9^k x 10 where the window ran on
    or was truncated, R where it terminated (``terminated``, not ``done``, stops the bootstrap)."""
    _, rows, parts = collected
    flat = rows.reshape(-1)
    td = flat.select("steps_to_next_obs", ("next", "reward"), ("next", "done"), ("next", "terminated"),
                     ("next", "truncated")).clone()
    target = parts.loss.value_estimator.value_estimate(td, next_value=torch.full((len(flat), 1), 10.0)).reshape(-1)
    reward = flat["next", "reward"].reshape(-1)
    k = flat["steps_to_next_obs"].reshape(-1).double()
    terminated = flat["next", "terminated"].reshape(-1)
    truncated = flat["next", "truncated"].reshape(-1) & ~terminated
    assert terminated.sum() >= 3 and truncated.sum() >= 3
    bootstrap = (GAMMA ** k * 10).float()
    assert torch.allclose(target[terminated], reward[terminated])
    assert torch.allclose(target[truncated], reward[truncated] + bootstrap[truncated])
    assert torch.allclose(target[~terminated], reward[~terminated] + bootstrap[~terminated])


def test_round_statistics_count_every_episode_with_its_return_and_length(collected):
    """Each round's finished episodes (copy by copy, in time order) with the hand-stepped returns and lengths, both
    the failed ones and the 20-step ones; a new trajectory id exactly where an episode starts."""
    rollouts, rows, _ = collected
    steps = [_hand_steps(rows, copy) for copy in range(COPIES)]
    for r, rollout in enumerate(rollouts):
        ended = [s for copy in range(COPIES) for s in steps[copy][r * STEPS:(r + 1) * STEPS]
                 if s["terminated"] or s["truncated"]]
        assert rollout.lengths == [float(s["length"]) for s in ended]
        assert rollout.returns == pytest.approx([s["return"] for s in ended])
        assert rollout.env_steps == COPIES * STEPS
    for copy in range(COPIES):
        ids = rows[:, copy]["collector", "traj_ids"].reshape(-1)
        starts = torch.tensor([s["first"] for s in steps[copy]])
        assert torch.equal(ids[1:] != ids[:-1], starts[1:])
