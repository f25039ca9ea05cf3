"""A worker's rollout: t_max steps in each of its batched games, acting with the local model."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from shared.envs import AtariBatch
from shared.models import AtariActorCritic


class Rollout:
    """Keeps the games' current observations between rollouts and turns each rollout into a torchrl TensorDict."""

    def __init__(self, env: AtariBatch, t_max: int):
        self.env = env
        self.t_max = t_max
        self.obs = torch.from_numpy(env.reset())

    @torch.no_grad()
    def collect(self, model: AtariActorCritic) -> tuple[TensorDict, list[tuple[int, float, int]]]:
        """Play ``t_max`` steps; returns the ``[envs, t_max]`` batch and the games that ended as ``(env, score, steps)``.

        The batch holds ``observation`` (uint8), ``action``, ``state_value`` and, under ``next``, the training
        ``reward`` / ``done`` / ``terminated`` and the bootstrap ``state_value``: the values come from the acting
        forward passes, so GAE needs no second pass over the data.
        """
        envs, steps = self.env.num_envs, self.t_max
        obs = torch.empty((envs, steps, *self.obs.shape[1:]), dtype=torch.uint8)
        actions = torch.empty((envs, steps), dtype=torch.int64)
        rewards = torch.empty((envs, steps, 1))
        dones = torch.empty((envs, steps, 1), dtype=torch.bool)
        values = torch.empty((envs, steps + 1, 1))
        finished: list[tuple[int, float, int]] = []
        for t in range(steps):
            obs[:, t] = self.obs
            logits, values[:, t] = model(self.obs)
            action = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
            next_obs, reward, done, ended = self.env.step(action.numpy())
            actions[:, t] = action
            rewards[:, t, 0] = torch.from_numpy(reward)
            dones[:, t, 0] = torch.from_numpy(done)
            finished += ended
            self.obs = torch.from_numpy(next_obs)
        values[:, steps] = model(self.obs)[1]
        batch = TensorDict(
            {
                "observation": obs,
                "action": actions,
                "state_value": values[:, :steps],
                "next": {"reward": rewards, "done": dones, "terminated": dones, "state_value": values[:, 1:]},
            },
            batch_size=[envs, steps],
        )
        return batch, finished
