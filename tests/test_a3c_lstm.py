"""The recurrent A3C agent (model.recurrent=lstm): its state carried per game across steps and rollouts and reset at a
game or life end, the update's gradients against a hand-unrolled loss, the evaluator's state, and the config rules."""
import copy
import json

import pytest
import torch
from tensordict import TensorDict
from torch.distributions import Categorical

from a3c.learner import A3CLearner
from a3c.rollout import Rollout
from shared.atari import AtariBatch, AtariSettings
from shared.models import AtariActorCritic

ENVS, STEPS, CHANNELS, SIZE = 2, 5, 2, 36


def lstm_model(num_actions: int = 4, seed: int = 0) -> AtariActorCritic:
    torch.manual_seed(seed)
    return AtariActorCritic(num_actions, CHANNELS, SIZE, "small", recurrent="lstm", lstm_size=16)


def test_the_state_is_carried_per_game_and_reset_at_a_game_or_life_end():
    """Breakout (5 lives) played by a random LSTM agent over several rollouts: every step starts from the previous
    step's state of its game, also across rollouts, except right after the game or a life ended (``is_init``), where
    it starts from zeros; ``start_state`` is where each rollout started."""
    model = lstm_model(num_actions=4)
    seen = []  # per step: (state in, state out)
    step = model.step

    def recording(frames, state):
        out = step(frames, state)
        if frames.shape[0] == ENVS:  # the acting steps (not a capped game's bootstrap)
            seen.append((state, out[2]))
        return out

    model.step = recording
    env = AtariBatch(AtariSettings(name="Breakout", image_size=SIZE, frame_stack=CHANNELS), ENVS, seed=0)
    rollout = Rollout(env, t_max=40)
    batches, starts = [], []
    try:
        for _ in range(5):
            before = len(seen)
            batch, _ = rollout.collect(model)
            batches.append(batch)
            starts.append(rollout.start_state)
            seen = seen[:before + 40]  # drop the bootstrap step after the rollout's last one
    finally:
        env.close()
    is_init = torch.cat([b["is_init"][..., 0] for b in batches], dim=1)  # [envs, steps over all rollouts]
    assert is_init[:, 0].all() and 0 < int(is_init[:, 1:].sum())  # lives were lost or games ended on the way
    done = torch.cat([b["next", "done"][..., 0] for b in batches], dim=1)
    assert torch.equal(is_init[:, 1:], done[:, :-1])  # a step starts an episode exactly after one ended
    zeros = torch.zeros(ENVS, 16)
    for t, (state_in, _) in enumerate(seen):
        previous = seen[t - 1][1] if t else (zeros, zeros)
        for env_index in range(ENVS):
            expected = zeros[env_index] if is_init[env_index, t] else previous[0][env_index]
            torch.testing.assert_close(state_in[0][env_index], expected)
    for k, start in enumerate(starts):  # each rollout starts from the previous one's last state (before any reset)
        expected = seen[40 * k - 1][1] if k else (zeros, zeros)
        torch.testing.assert_close(start[0], expected[0])
        torch.testing.assert_close(start[1], expected[1])


def test_the_update_sees_the_states_the_agent_acted_with():
    """The learner's unroll of a real rollout (Breakout: lives are lost inside it) reproduces the acting pass: from
    ``start_state``, with the resets at ``is_init``, the values it computes are the ones the agent recorded while
    acting, step by step, across three consecutive rollouts. A mismatch would train the policy on states it never
    acted in."""
    model = lstm_model(num_actions=4)
    env = AtariBatch(AtariSettings(name="Breakout", image_size=SIZE, frame_stack=CHANNELS), ENVS, seed=1)
    rollout = Rollout(env, t_max=60)
    resets = 0
    try:
        for _ in range(3):
            batch, _ = rollout.collect(model)
            resets += int(batch["is_init"][:, 1:].sum())
            with torch.no_grad():
                hidden = model.features(batch["observation"], rollout.start_state, batch["is_init"][..., 0])
                torch.testing.assert_close(model.value_head(hidden), batch["state_value"], rtol=1e-4, atol=1e-5)
    finally:
        env.close()
    assert resets > 0  # the resets inside the rollouts were exercised


def recurrent_rollout(seed: int) -> tuple[TensorDict, tuple[torch.Tensor, torch.Tensor]]:
    """A rollout with the layout Rollout.collect produces (random data; resets inside it) and a start state."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(ENVS, STEPS + 1, 1, generator=g)
    dones = torch.zeros(ENVS, STEPS, 1, dtype=torch.bool)
    dones[0, 1] = dones[1, 3] = True
    is_init = torch.zeros(ENVS, STEPS, 1, dtype=torch.bool)
    is_init[:, 1:] = dones[:, :-1]
    rollout = TensorDict({
        "observation": torch.randint(0, 255, (ENVS, STEPS, CHANNELS, SIZE, SIZE), dtype=torch.uint8, generator=g),
        "action": torch.randint(0, 4, (ENVS, STEPS), generator=g),
        "fire_forced": torch.zeros(ENVS, STEPS, 1, dtype=torch.bool),
        "is_init": is_init,
        "state_value": values[:, :STEPS],
        "next": {"reward": torch.randn(ENVS, STEPS, 1, generator=g), "done": dones, "terminated": dones,
                 "state_value": values[:, 1:]},
    }, batch_size=[ENVS, STEPS])
    start = (torch.randn(ENVS, 16, generator=g), torch.randn(ENVS, 16, generator=g))
    return rollout, start


def test_the_update_backpropagates_through_the_rollout_as_a_hand_unrolled_loss():
    """The gradients the update copies into the global model equal those of A2C's loss with the LSTM unrolled by
    hand: from the rollout's start state, through every step (backprop through time), back to zeros where an
    episode started; n-step advantages (lambda 1), critic 0.5 mean((G - V)^2), entropy bonus 0.01."""
    global_model = lstm_model()
    learner = A3CLearner(copy.deepcopy(global_model), global_model, torch.optim.SGD(global_model.parameters(), lr=0.0),
                         gamma=0.9, gae_lambda=1.0, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2",
                         max_grad_norm=1e9, rollout_size=ENVS * STEPS)
    rollout, start = recurrent_rollout(0)
    model = copy.deepcopy(global_model)
    h, c = start
    logits, values = [], []
    for t in range(STEPS):
        keep = (~rollout["is_init"][:, t]).float()
        h, c = model.lstm(model.trunk(rollout["observation"][:, t]), (h * keep, c * keep))
        logits.append(model.policy_head(h))
        values.append(model.value_head(h)[:, 0])
    logits, values = torch.stack(logits, 1), torch.stack(values, 1)
    r, d = rollout["next", "reward"][..., 0], rollout["next", "done"][..., 0].float()
    returns, ret = torch.zeros(ENVS, STEPS), rollout["next", "state_value"][:, -1, 0]
    for t in reversed(range(STEPS)):
        ret = r[:, t] + 0.9 * (1 - d[:, t]) * ret
        returns[:, t] = ret
    advantage = returns - rollout["state_value"][..., 0]
    dist = Categorical(logits=logits)
    loss = (-(dist.log_prob(rollout["action"]) * advantage).mean() + 0.5 * ((returns - values) ** 2).mean()
            - 0.01 * dist.entropy().mean())
    loss.backward()

    learner.update(rollout, start)
    for (name, expected), actual in zip(model.named_parameters(), global_model.parameters()):
        torch.testing.assert_close(actual.grad, expected.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert global_model.lstm.weight_hh.grad.abs().sum() > 0  # the gradient went back through time
    # without the resets (or from zeros instead of the start state) the gradients differ
    rollout_no_reset, _ = recurrent_rollout(0)
    rollout_no_reset["is_init"].zero_()
    other = A3CLearner(copy.deepcopy(model), copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0),
                       gamma=0.9, gae_lambda=1.0, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2",
                       max_grad_norm=1e9, rollout_size=ENVS * STEPS)
    other.update(rollout_no_reset, start)
    assert not torch.allclose(other.global_model.lstm.weight_ih.grad, global_model.lstm.weight_ih.grad)


def test_a_smoke_run_with_the_lstm_agent_trains_and_evaluates_and_its_config_is_checked(tmp_path):
    """``model.recurrent=lstm`` end to end: two workers train and the final greedy evaluation plays with the state;
    the checkpoint holds the LSTM. A resume may not change the core, and minibatches or an unknown core are refused
    (config errors: one line, exit 2, checked in process here; the CLI path is the same for every key)."""
    from omegaconf import OmegaConf

    from a3c.config import load_config
    from proc import run_module
    from shared.config import ConfigError

    run_dir = tmp_path / "lstm"
    # no periodic evaluator process: it plays with the state through the same greedy_episodes as the final
    # evaluation checked here, and on 2 cores a third process slows the two workers
    first = run_module("a3c.train", "env=Pong", "workers=2", "profile=smoke", "model.recurrent=lstm",
                       "eval.interval_frames=0", f"run_dir={run_dir}")
    assert first.returncode == 0, first.stderr[-2000:]
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["model"]["lstm.weight_hh"].shape == (4 * 256, 256) and ckpt["config"]["model"]["recurrent"] == "lstm"
    assert ckpt["counters"]["frames"] >= 1280
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_eval"]["episodes"] == 1
    base = OmegaConf.to_container(OmegaConf.create(ckpt["config"]))
    assert load_config([], base=base).model.recurrent == "lstm"  # a resume keeps it
    with pytest.raises(ConfigError, match="model.recurrent"):
        load_config(["model.recurrent=null"], base=base)
    with pytest.raises(ConfigError, match="a3c.minibatches=2 is not allowed with model.recurrent=lstm"):
        load_config(["model.recurrent=lstm", "a3c.minibatches=2"])
    with pytest.raises(ConfigError, match="model.recurrent"):
        load_config(["model.recurrent=gru"])


def test_the_feed_forward_model_has_no_state():
    model = AtariActorCritic(4, CHANNELS, SIZE, "small")
    frames = torch.randint(0, 255, (3, CHANNELS, SIZE, SIZE), dtype=torch.uint8)
    logits, value, state = model.step(frames, model.initial_state(3))
    assert state is None and logits.shape == (3, 4) and value.shape == (3, 1)
    torch.testing.assert_close(model(frames)[0], logits)
    with pytest.raises(TypeError):
        lstm_model()(frames)
