"""n-step returns (``loss.n_steps``): each stored transition ``t`` becomes ``(s_t, a_t, R, s_{t+k})`` with
``R = sum_{i<k} gamma^i r_{t+i}`` and ``steps_to_next_obs = k``, which torchrl's value estimators read to discount the
bootstrap by ``gamma^k``. The window stops early at the first ended step (termination, truncation, on Atari a lost
life) and at the end of the collected batch, so ``k <= n``.

Why our own: torchrl 0.14.1's ``MultiStepTransform`` keeps the first step's done flags when its window reaches a
termination, so such a transition bootstraps from the terminal observation (checked: a 3-step window ending in a
termination gets ``done=False``); here the window's last step gives the done flags. It also holds back the last
``n`` steps of every batch, which our per-round invariants (every collected transition written) would reject.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.envs.transforms import Transform


def n_step_transitions(rollout: TensorDictBase, n: int, gamma: float) -> TensorDictBase:
    """The n-step transitions of ``rollout`` ``[num_envs, T]`` (time last), a new TensorDict of the same shape: root
    entries are step ``t``'s; ``"next"`` entries (observation, done flags, ...) are those of the window's last step
    ``t + k - 1``; ``("next", "reward")`` is the discounted sum over the window and ``"steps_to_next_obs"`` is ``k``.
    ``n=1`` returns the rollout with ``steps_to_next_obs = 1``."""
    num_envs, steps = rollout.shape
    nxt = rollout.get("next")
    reward = nxt.get("reward")
    ended = nxt.get("done").reshape(num_envs, steps)
    flat_reward = reward.reshape(num_envs, steps)
    total = torch.zeros_like(flat_reward)
    k = torch.zeros(num_envs, steps, dtype=torch.int64)
    alive = torch.ones(num_envs, steps, dtype=torch.bool)  # the window of t still runs at offset i
    time = torch.arange(steps)
    for i in range(n):
        index = time + i
        inside = index < steps
        index = index.clamp(max=steps - 1)
        take = alive & inside
        total += torch.where(take, flat_reward[:, index], 0.0) * gamma ** i
        k += take
        alive = take & ~ended[:, index]
    last = time + k - 1  # the window's last step: its "next" entries end the transition
    out = rollout.clone(False)
    out.set("next", nxt[torch.arange(num_envs).unsqueeze(-1), last])
    out.set(("next", "reward"), total.reshape(reward.shape))
    out.set("steps_to_next_obs", k.unsqueeze(-1))
    return out


class NStepReturns(Transform):
    """A replay-buffer transform applying :func:`n_step_transitions` on write (``extend``); sampling passes through.
    Each write is one collector's batch flattened ``[num_envs * T]`` env by env (``for_replay``)."""

    def __init__(self, n: int, gamma: float, num_envs: int):
        super().__init__()
        self.n, self.gamma, self.num_envs = n, gamma, num_envs

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        rollout = tensordict.reshape(self.num_envs, -1)
        return n_step_transitions(rollout, self.n, self.gamma).reshape(-1)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict
