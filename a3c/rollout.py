"""A worker's rollout: t_max steps in each of its batched games, acting with the local model."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from shared.atari import AtariBatch
from shared.models import AtariActorCritic, RecurrentState


def reset_where(state: RecurrentState | None, new: torch.Tensor) -> RecurrentState | None:
    """``state`` with the rows of games where ``new`` is true back to zeros (a new game or life)."""
    if state is None or not bool(new.any()):
        return state
    keep = (~new).unsqueeze(-1).to(state[0].dtype)
    return state[0] * keep, state[1] * keep


def select(state: RecurrentState | None, rows: torch.Tensor) -> RecurrentState | None:
    return None if state is None else (state[0][rows], state[1][rows])


class Rollout:
    """Keeps the games' current observations (and a recurrent model's state, per game) between rollouts and turns
    each rollout into a torchrl TensorDict."""

    def __init__(self, env: AtariBatch, t_max: int):
        self.env = env
        self.t_max = t_max
        self.obs = torch.from_numpy(env.reset())
        self.new_episode = torch.ones(env.num_envs, dtype=torch.bool)  # the next step starts a game or a life
        self.state: RecurrentState | None = None  # the recurrent state the next step starts from
        self.start_state: RecurrentState | None = None  # the state the latest rollout started from (for BPTT)

    @torch.no_grad()
    def collect(self, model: AtariActorCritic) -> tuple[TensorDict, list[tuple[int, float, int]]]:
        """Play ``t_max`` steps; returns the ``[envs, t_max]`` batch and the games that ended as ``(env, score, steps)``.

        The batch holds ``observation`` (uint8), ``action``, ``state_value``, ``is_init`` (the step starts a game or a
        life: a recurrent model's state is back to zeros there) and, under ``next``, the training
        ``reward`` / ``done`` / ``terminated`` and the bootstrap ``state_value``: the values come from the acting
        forward passes, so GAE needs no second pass over the data. A game cut at the frame cap is done but not
        terminated: its bootstrap value is that of its last observation, not of the next game's first. ``action`` is
        what the game ran: FIRE where the env forced it after a lost life (``fire_forced``), not the sampled one.
        A recurrent model's state is carried from step to step and from rollout to rollout, per game;
        :attr:`start_state` keeps where this rollout started, for truncated backprop through it.
        """
        envs, steps = self.env.num_envs, self.t_max
        if self.state is None:
            self.state = model.initial_state(envs)
        self.start_state = self.state
        obs = torch.empty((envs, steps, *self.obs.shape[1:]), dtype=torch.uint8)
        actions = torch.empty((envs, steps), dtype=torch.int64)
        fire_forced = torch.empty((envs, steps, 1), dtype=torch.bool)
        rewards = torch.empty((envs, steps, 1))
        dones = torch.empty((envs, steps, 1), dtype=torch.bool)
        terminated = torch.empty((envs, steps, 1), dtype=torch.bool)
        values = torch.empty((envs, steps + 1, 1))
        is_init = torch.empty((envs, steps, 1), dtype=torch.bool)
        capped: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (step, envs, their value at the cap)
        finished: list[tuple[int, float, int]] = []
        for t in range(steps):
            obs[:, t] = self.obs
            is_init[:, t, 0] = self.new_episode
            state = reset_where(self.state, self.new_episode)
            logits, values[:, t], self.state = model.step(self.obs, state)
            action = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
            step = self.env.step(action.numpy())
            actions[:, t] = torch.from_numpy(step.action)
            fire_forced[:, t, 0] = torch.from_numpy(step.fire_forced)
            rewards[:, t, 0] = torch.from_numpy(step.reward)
            dones[:, t, 0] = torch.from_numpy(step.done)
            terminated[:, t, 0] = torch.from_numpy(step.terminated)
            if step.final_obs is not None:
                cut = torch.from_numpy(step.done & ~step.terminated).nonzero().squeeze(-1)
                if len(cut):
                    final = torch.from_numpy(step.final_obs[cut.numpy()])
                    capped.append((t, cut, model.step(final, select(self.state, cut))[1]))
            finished += step.finished
            self.obs = torch.from_numpy(step.obs)
            self.new_episode = torch.from_numpy(step.done)
        values[:, steps] = model.step(self.obs, reset_where(self.state, self.new_episode))[1]
        next_values = values[:, 1:].clone()
        for t, cut, value in capped:
            next_values[cut, t] = value
        batch = TensorDict(
            {
                "observation": obs,
                "action": actions,
                "fire_forced": fire_forced,
                "state_value": values[:, :steps],
                "is_init": is_init,
                "next": {"reward": rewards, "done": dones, "terminated": terminated, "state_value": next_values},
            },
            batch_size=[envs, steps],
        )
        return batch, finished
