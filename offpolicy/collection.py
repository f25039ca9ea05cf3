"""Local collection for Gymnasium state-vector envs without torchrl's ``Collector`` (``collector.lean=true``).

Why our own: at one CartPole env, torchrl's GymEnv, its transforms and the Collector cost ~400 µs per env step around
a ~6 µs simulator step (benchmarks/offpolicy_collection_cost.py; by cProfile, tensordict and torchrl Python work on
every step). Here the Gymnasium env copies are stepped in a loop with numpy (episode bookkeeping in numpy too), the
policy (the same torchrl modules) acts on plain tensors where it offers ``act``
(:class:`~offpolicy.algos.base.ActsOnTensors`; else on one small TensorDict per step), and each batch becomes one
TensorDict with the keys the engine reads from a Collector's batch: replay, losses, statistics and invariants are
unchanged. ALE games, dm_control, pixels, envpool and process-parallel
envs keep torchrl's Collector (:func:`lean_collection`).

Semantics kept from the Collector path: copy ``i`` seeded ``seed + i``; float32 observations (torchrl's
DoubleToFloat), standardised with the run's ObservationNorm statistics; ``("next", "observation")`` of a finished
episode is its true final observation (Gymnasium's same-step autoreset); ``("next", "episode_reward")`` and
``step_count`` (root and next) as RewardSum and StepCounter write them; ``is_init`` on the first step of an episode (OU
noise); ``("next", "policy_version")`` the published version; ``("collector", "traj_ids")`` a new id per episode.
"""
from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig
from tensordict import TensorDict

from offpolicy.algos.base import ActsOnTensors
from shared.atari import is_atari


def lean_collection(cfg: DictConfig) -> bool:
    """Whether a collector (the local engine's, or each Ray collector actor's) is a :class:`LeanCollector`:
    ``collector.lean``, a Gymnasium state-vector env stepped in the collector's process, and the policy on the CPU
    (a Ray collector with a GPU runs torchrl's Collector)."""
    return bool(cfg.collector.lean and cfg.env.backend == "gymnasium"
                and not is_atari(cfg.env.name) and not cfg.env.from_pixels and not cfg.env.name.startswith("dmc:")
                and (cfg.env.num_envs == 1 or cfg.env.vector == "serial")
                and (cfg.engine == "local" or not cfg.ray.collector_gpus))


class LeanCollector:
    """Batches of ``env_steps_per_batch`` transitions, ``[num_envs, T]``, from the stochastic ``policy``.

    Offers what the local engine uses of torchrl's ``Collector``: iteration, ``update_policy_weights_()`` (the
    policy is shared, so publishing bumps the version), ``policy_version``, ``policy_version_tracker.version`` and
    ``shutdown()``. ``spec_env`` (the torchrl training env, read for its specs and observation statistics) is closed
    on shutdown, as the Collector closes its env.
    """

    def __init__(self, cfg: DictConfig, spec_env, policy, seed: int, obs_norm: dict | None, env_steps_per_batch: int):
        import gymnasium as gym
        from torchrl.data import OneHot

        n = cfg.env.num_envs
        self.spec_env, self.policy = spec_env, policy
        # a policy that also acts on plain tensors (offpolicy/algos/policies.py) skips the per-step TensorDict
        self.act = policy.act if isinstance(policy, ActsOnTensors) else None
        self.steps = env_steps_per_batch // n
        # the copies stepped in a loop here, not by Gymnasium's SyncVectorEnv: its step costs ~20 µs more per call
        # (info dicts merged, observations copied), a quarter of a CartPole collection step
        self.envs = [gym.make(cfg.env.name) for _ in range(n)]
        observation = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])
        self.norm = (obs_norm["loc"], obs_norm["scale"]) if obs_norm is not None else None
        self.observation = self._observation(observation)
        # one-hot actions (torchrl's OneHot spec, DQN) -> the env's integer actions
        self.discrete = isinstance(spec_env.action_spec_unbatched, OneHot)
        # per-copy episode state in numpy: a step's bookkeeping is ~10 small array operations, each ~5x cheaper in
        # numpy than in torch; the batch becomes tensors once, at its end
        self.episode_reward = np.zeros(n, dtype=np.float32)
        self.step_count = np.zeros(n, dtype=np.int64)
        self.is_init = np.ones(n, dtype=bool)
        self.traj_ids = np.arange(n)
        self.next_traj_id = n
        self.noise_state: dict[str, torch.Tensor] = {}
        self.version = 0
        self.policy_version_tracker = self  # torchrl's Collector keeps the version on its tracker

    def _step(self, actions: np.ndarray):
        """One step of every copy; a copy whose episode ended starts the next one at once (Gymnasium's same-step
        autoreset). Returns the step's observations, the observations to act on next (the new episodes' first where
        one ended), rewards, terminated and truncated flags."""
        results = [env.step(action) for env, action in zip(self.envs, actions)]
        last = np.stack([r[0] for r in results])
        reward = np.array([r[1] for r in results], dtype=np.float32)
        terminated = np.array([r[2] for r in results], dtype=bool)
        truncated = np.array([r[3] for r in results], dtype=bool)
        ended = np.flatnonzero(terminated | truncated)
        obs = last.copy() if len(ended) else last
        for i in ended:
            obs[i] = self.envs[i].reset()[0]
        return last, obs, reward, terminated, truncated

    def _observation(self, array) -> torch.Tensor:
        obs = torch.as_tensor(array, dtype=torch.float32)
        if self.norm is not None:
            obs = (obs - self.norm[0]) / self.norm[1]
        return obs

    @property
    def policy_version(self) -> int:
        return self.version

    def update_policy_weights_(self) -> None:
        self.version += 1

    def __iter__(self):
        while True:
            yield self.collect()

    @torch.no_grad()
    def collect(self) -> TensorDict:
        """One batch ``[num_envs, T]`` from the current policy."""
        from torchrl.envs.utils import ExplorationType, set_exploration_type

        n, steps = self.observation.shape[0], self.steps
        rows = []
        with set_exploration_type(ExplorationType.RANDOM):
            for _ in range(steps):
                if self.act is not None:
                    action = self.act(self.observation)
                else:
                    is_init = torch.from_numpy(self.is_init).reshape(n, 1)
                    td = TensorDict({"observation": self.observation, "is_init": is_init, **self.noise_state}, [n])
                    td = self.policy(td)
                    # OU noise keeps its process state in the tensordict ("_ou_*"): carried to the next step, as
                    # the Collector's step_mdp carries it
                    self.noise_state = {k: td[k] for k in td.keys() if isinstance(k, str) and k.startswith("_")}
                    action = td["action"]
                env_action = (action.argmax(-1) if self.discrete else action).numpy()
                last_obs, obs, reward, terminated, truncated = self._step(env_action)
                done = terminated | truncated
                next_obs = self._observation(obs)
                any_ended = bool(done.any())
                last = self._observation(last_obs) if any_ended else next_obs
                self.episode_reward += reward
                self.step_count += 1
                rows.append((self.observation, action, last, self.is_init, self.traj_ids.copy(), reward, done,
                             terminated, truncated, self.episode_reward.copy(), self.step_count.copy()))
                self.is_init = done
                if any_ended:
                    self.episode_reward[done] = 0.0
                    self.step_count[done] = 0
                    new = int(done.sum())
                    self.traj_ids[done] = np.arange(self.next_traj_id, self.next_traj_id + new)
                    self.next_traj_id += new
                self.observation = next_obs
        columns = list(zip(*rows))
        obs, action, last = (torch.stack(c, dim=1) for c in columns[:3])  # [n, T, ...]
        is_init, traj, reward, done, terminated, truncated, episode_reward, step_count = (
            torch.from_numpy(np.stack(c, axis=1)) for c in columns[3:])  # [n, T]
        return TensorDict({
            "observation": obs, "action": action, "is_init": is_init.unsqueeze(-1), ("collector", "traj_ids"): traj,
            "step_count": (step_count - 1).unsqueeze(-1),
            "next": {"observation": last, "reward": reward.unsqueeze(-1), "done": done.unsqueeze(-1),
                     "terminated": terminated.unsqueeze(-1), "truncated": truncated.unsqueeze(-1),
                     "episode_reward": episode_reward.unsqueeze(-1), "step_count": step_count.unsqueeze(-1),
                     "policy_version": torch.full((n, steps), self.version, dtype=torch.int64)},
        }, batch_size=[n, steps])

    def shutdown(self) -> None:
        for env in self.envs:
            env.close()
        self.spec_env.close()
