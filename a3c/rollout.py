"""A worker's rollout: t_max steps in each of its batched games, acting with the local model."""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from shared.atari import AtariBatch
from shared.models import AtariActorCritic, RecurrentState


def reset_where(state: RecurrentState | None, new: np.ndarray) -> RecurrentState | None:
    """``state`` with the rows of games where ``new`` (bool ``[E]``) is true back to zeros (a new game or life)."""
    if state is None or not new.any():
        return state
    keep = torch.from_numpy(~new).unsqueeze(-1).to(state[0].dtype)
    return state[0] * keep, state[1] * keep


def select(state: RecurrentState | None, rows: torch.Tensor) -> RecurrentState | None:
    return None if state is None else (state[0][rows], state[1][rows])


class Rollout:
    """Keeps the games' current observations (and a recurrent model's state, per game) between rollouts and turns
    each rollout into a torchrl TensorDict."""

    def __init__(self, env: AtariBatch, t_max: int):
        self.env = env
        self.t_max = t_max
        self.obs = env.reset()  # uint8 [E, C, H, W]
        self.new_episode = np.ones(env.num_envs, dtype=bool)  # the next step starts a game or a life
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
        # the per-step bookkeeping goes into numpy arrays, wrapped as tensors once per rollout: a numpy slice store is
        # a few times cheaper than torch's indexing, which runs cold after every emulator step (rollout_rest in
        # benchmarks/a3c_throughput.py)
        obs = np.empty((envs, steps, *self.obs.shape[1:]), dtype=np.uint8)
        actions = np.empty((envs, steps), dtype=np.int64)
        fire_forced = np.empty((envs, steps, 1), dtype=bool)
        rewards = np.empty((envs, steps, 1), dtype=np.float32)
        dones = np.empty((envs, steps, 1), dtype=bool)
        terminated = np.empty((envs, steps, 1), dtype=bool)
        values = np.empty((envs, steps + 1, 1), dtype=np.float32)
        is_init = np.empty((envs, steps, 1), dtype=bool)
        capped: list[tuple[int, np.ndarray, torch.Tensor]] = []  # (step, envs, their value at the cap)
        finished: list[tuple[int, float, int]] = []
        for t in range(steps):
            obs[:, t] = self.obs
            is_init[:, t, 0] = self.new_episode
            state = reset_where(self.state, self.new_episode)
            logits, value, self.state = model.step(torch.from_numpy(self.obs), state)
            values[:, t] = value.numpy()
            action = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
            step = self.env.step(action.numpy())
            actions[:, t] = step.action
            fire_forced[:, t, 0] = step.fire_forced
            rewards[:, t, 0] = step.reward
            dones[:, t, 0] = step.done
            terminated[:, t, 0] = step.terminated
            if step.final_obs is not None:
                cut = np.flatnonzero(step.done & ~step.terminated)
                if len(cut):
                    final = torch.from_numpy(step.final_obs[cut])
                    capped.append((t, cut, model.step(final, select(self.state, torch.from_numpy(cut)))[1]))
            finished += step.finished
            self.obs = step.obs
            self.new_episode = step.done
        values[:, steps] = model.step(torch.from_numpy(self.obs), reset_where(self.state, self.new_episode))[1].numpy()
        next_values = torch.from_numpy(values[:, 1:].copy())
        for t, cut, value in capped:
            next_values[cut, t] = value
        batch = TensorDict(
            {
                "observation": torch.from_numpy(obs),
                "action": torch.from_numpy(actions),
                "fire_forced": torch.from_numpy(fire_forced),
                "state_value": torch.from_numpy(values[:, :steps]),
                "is_init": torch.from_numpy(is_init),
                "next": {"reward": torch.from_numpy(rewards), "done": torch.from_numpy(dones),
                         "terminated": torch.from_numpy(terminated), "state_value": next_values},
            },
            batch_size=[envs, steps],
        )
        return batch, finished
