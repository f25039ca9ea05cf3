"""Batched simulator backends for the training env (``env.backend``), each a torchrl env of batch ``[num_envs]`` with
the specs of the Gymnasium version of the task:

- ``gymnasium``: torchrl ``GymEnv`` copies (built by the caller, ``shared/envs.py``);
- ``envpool``: ``num_envs`` copies stepped by envpool's C++ thread pool in one call (:class:`EnvPoolEnv`).

EnvPoolEnv is our own wrapper because torchrl 0.14.1's ``MultiThreadedEnv`` does not work here: it needs the retired ``gym``
package for its specs, then cannot convert the Gymnasium spaces envpool 1.2.5 returns; and its
``step_and_maybe_reset`` leaves envpool's next-step autoreset in place, so the step after a ``done`` is a reset
written as a transition (reward 0, from the last observation to the first of the next episode), which replay must
never see. Here a done env is reset explicitly (``reset(env_ids)``), which clears envpool's pending autoreset: every
step the collector records is a real one.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, OneHot, Unbounded
from torchrl.envs import EnvBase

from shared.config import ConfigError

MISSING = "envpool is not installed; allowed: env.backend=gymnasium, or pip install -e '.[envpool]'"


ENV_BACKENDS = ("gymnasium", "envpool")


def check_backend(backend: str, name: str) -> None:
    """A ``ConfigError`` naming the missing piece unless ``backend`` can step task ``name`` here."""
    if backend == "envpool":
        _check_envpool_task(name)


def make_batched_env(backend: str, name: str, num_envs: int, seed: int):
    """``num_envs`` copies of ``name`` stepped by ``backend`` (a batched one: envpool) as one torchrl env; the config
    has passed :func:`check_backend` (``offpolicy.config``), so this builds without checking again (Ray collector
    actors build theirs too)."""
    if backend != "envpool":
        raise ValueError(f"{backend!r} is not a batched env backend; allowed: envpool")
    return EnvPoolEnv(name, num_envs, seed)


def envpool_tasks() -> frozenset:
    """The task ids envpool can build (empty when envpool is not installed)."""
    try:
        import envpool
    except ImportError:
        return frozenset()
    return frozenset(envpool.list_all_envs())


def _spec(space, shape: tuple[int, ...], *, action: bool):
    """torchrl spec of a Gymnasium space (Box or Discrete), batched with ``shape``; Box actions are float32 as in
    Gymnasium's MuJoCo tasks (envpool declares float64), observations keep envpool's dtype."""
    import gymnasium

    if isinstance(space, gymnasium.spaces.Discrete):
        return OneHot(int(space.n), shape=(*shape, int(space.n)), dtype=torch.int64)
    dtype = torch.float32 if action else torch.from_numpy(np.zeros((), space.dtype)).dtype
    full = (*shape, *space.shape)
    if np.isinf(space.low).all() and np.isinf(space.high).all():  # torchrl's GymEnv rule: Unbounded only if no bound
        return Unbounded(shape=full, dtype=dtype)
    return Bounded(torch.as_tensor(space.low, dtype=dtype).expand(full),
                   torch.as_tensor(space.high, dtype=dtype).expand(full), shape=full, dtype=dtype)


def _check_envpool_task(name: str) -> None:
    tasks = envpool_tasks()
    if not tasks:
        raise ConfigError(f"env.backend=envpool: {MISSING}")
    if name not in tasks:
        close = sorted(t for t in tasks if t.split("-")[0].lower() == name.split("-")[0].lower())
        raise ConfigError(f"env.name={name!r} is not an envpool task; allowed with env.backend=envpool: "
                          + (", ".join(close) if close else "a Gymnasium MuJoCo or classic-control id envpool has "
                                                           "(HalfCheetah-v5, Hopper-v5, Humanoid-v5, Pendulum-v1, ...)"))


class EnvPoolEnv(EnvBase):
    """``num_envs`` copies of an envpool task, batch ``[num_envs]``; keys ``observation``, ``action``, ``reward``,
    ``done``, ``terminated``, ``truncated`` as from torchrl's ``GymEnv``."""

    def __init__(self, name: str, num_envs: int, seed: int):
        super().__init__(batch_size=torch.Size([num_envs]))
        self.name, self.num_envs = name, num_envs
        self._pool = self._make_pool(seed)
        shape = (num_envs,)
        self.observation_spec = Composite(observation=_spec(self._pool.observation_space, shape, action=False),
                                          shape=shape)
        self.action_spec = _spec(self._pool.action_space, shape, action=True)
        self.reward_spec = Unbounded(shape=(*shape, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*shape, 1), dtype=torch.bool)
        self.done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=shape)
        self._discrete = isinstance(self.action_spec, OneHot)
        obs_spec = self.observation_spec["observation"]
        self._obs = torch.zeros(obs_spec.shape, dtype=obs_spec.dtype)

    def _make_pool(self, seed: int):
        import envpool

        # batch_size defaults to num_envs: synchronous steps of every copy; envpool seeds copy i with seed + i
        return envpool.make_gymnasium(self.name, num_envs=self.num_envs, seed=int(seed))

    def _set_seed(self, seed: int | None) -> None:
        self._pool.close()
        self._pool = self._make_pool(0 if seed is None else seed)

    def _flags(self, terminated=None, truncated=None) -> dict:
        zeros = torch.zeros((self.num_envs, 1), dtype=torch.bool)
        term = zeros if terminated is None else torch.as_tensor(terminated).reshape(-1, 1)
        trunc = zeros if truncated is None else torch.as_tensor(truncated).reshape(-1, 1)
        return {"done": term | trunc, "terminated": term, "truncated": trunc}

    def _reset(self, tensordict=None, **kwargs):
        mask = tensordict.get("_reset", None) if tensordict is not None else None
        if mask is None or mask.all():
            obs, _ = self._pool.reset()
            self._obs = torch.as_tensor(obs, dtype=self._obs.dtype)
        else:
            ids = np.flatnonzero(mask.reshape(-1).numpy())
            obs, _ = self._pool.reset(ids)  # also cancels envpool's own autoreset of these copies
            self._obs[torch.as_tensor(ids)] = torch.as_tensor(obs, dtype=self._obs.dtype)
        return TensorDict({"observation": self._obs.clone(), **self._flags()}, batch_size=self.batch_size)

    def _step(self, tensordict):
        action = tensordict.get("action")
        action = action.argmax(-1) if self._discrete else action
        obs, reward, terminated, truncated, _ = self._pool.step(action.cpu().numpy())
        self._obs = torch.as_tensor(obs, dtype=self._obs.dtype)
        return TensorDict({"observation": self._obs.clone(),
                           "reward": torch.as_tensor(reward, dtype=torch.float32).reshape(-1, 1),
                           **self._flags(terminated, truncated)}, batch_size=self.batch_size)

    def close(self, *, raise_if_closed: bool = True):
        self._pool.close()
        super().close(raise_if_closed=raise_if_closed)
