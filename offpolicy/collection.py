"""Local collection for Gymnasium state-vector envs without torchrl's ``Collector`` (``collector.lean=true``).

Why our own: at one CartPole env, torchrl's GymEnv, its transforms and the Collector cost ~400 µs per env step around
a ~6 µs simulator step (benchmarks/offpolicy_collection_cost.py; by cProfile, tensordict and torchrl Python work on
every step). Here one Gymnasium vector env is stepped with numpy, the policy (the same torchrl modules) sees one small
TensorDict per step (or plain tensors, where it offers ``act``: :class:`~offpolicy.algos.base.ActsOnTensors`), and each batch becomes one TensorDict with the keys the engine reads from a Collector's batch:
replay, losses, statistics and invariants are unchanged. ALE games, dm_control, pixels, envpool and process-parallel
envs keep torchrl's Collector (:func:`lean_collection`).

Semantics kept from the Collector path: copy ``i`` seeded ``seed + i``; float32 observations (torchrl's
DoubleToFloat), standardised with the run's ObservationNorm statistics; ``("next", "observation")`` of a finished
episode is its true final observation (Gymnasium's same-step autoreset); ``("next", "episode_reward")`` and
``step_count`` (root and next) as RewardSum and StepCounter write them; ``is_init`` on the first step of an episode (OU
noise); ``("next", "policy_version")`` the published version; ``("collector", "traj_ids")`` a new id per episode.
"""
from __future__ import annotations

from functools import partial

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
        # a policy that also acts on plain tensors (DQN's epsilon-greedy) skips the per-step TensorDict
        self.act = policy.act if isinstance(policy, ActsOnTensors) else None
        self.steps = env_steps_per_batch // n
        self.envs = gym.vector.SyncVectorEnv([partial(gym.make, cfg.env.name) for _ in range(n)],
                                             autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        observation, _ = self.envs.reset(seed=[seed + i for i in range(n)])
        self.norm = (obs_norm["loc"], obs_norm["scale"]) if obs_norm is not None else None
        self.observation = self._observation(observation)
        # one-hot actions (torchrl's OneHot spec, DQN) -> the env's integer actions
        self.discrete = isinstance(spec_env.action_spec_unbatched, OneHot)
        self.episode_reward = torch.zeros(n, 1)
        self.step_count = torch.zeros(n, 1, dtype=torch.int64)
        self.is_init = torch.ones(n, 1, dtype=torch.bool)
        self.traj_ids = torch.arange(n)
        self.next_traj_id = n
        self.noise_state: dict[str, torch.Tensor] = {}
        self.version = 0
        self.policy_version_tracker = self  # torchrl's Collector keeps the version on its tracker

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
                    td = TensorDict({"observation": self.observation, "is_init": self.is_init, **self.noise_state},
                                    [n])
                    td = self.policy(td)
                    # OU noise keeps its process state in the tensordict ("_ou_*"): carried to the next step, as
                    # the Collector's step_mdp carries it
                    self.noise_state = {k: td[k] for k in td.keys() if isinstance(k, str) and k.startswith("_")}
                    action = td["action"]
                env_action = (action.argmax(-1) if self.discrete else action).numpy()
                obs, reward, terminated, truncated, info = self.envs.step(env_action)
                terminated = torch.as_tensor(terminated).reshape(n, 1)
                truncated = torch.as_tensor(truncated).reshape(n, 1)
                done = terminated | truncated
                ended = done.reshape(n)
                any_ended = bool(ended.any())
                next_obs = self._observation(obs)
                last = next_obs
                if any_ended:  # same-step autoreset: obs starts the new episode; the true last one is in info
                    last = next_obs.clone()
                    last[ended] = self._observation(np.stack(info["final_obs"][info["_final_obs"]]))
                reward = torch.as_tensor(reward, dtype=torch.float32).reshape(n, 1)
                self.episode_reward += reward
                self.step_count += 1
                rows.append((self.observation, action, self.is_init, self.traj_ids.clone(), last, reward, done,
                             terminated, truncated, self.episode_reward.clone(), self.step_count.clone()))
                self.is_init = done
                if any_ended:
                    self.episode_reward[ended] = 0.0
                    self.step_count[ended] = 0
                    new = int(ended.sum())
                    self.traj_ids[ended] = torch.arange(self.next_traj_id, self.next_traj_id + new)
                    self.next_traj_id += new
                self.observation = next_obs
        columns = [torch.stack(c, dim=1) for c in zip(*rows)]  # [n, T, ...]
        obs, action, is_init, traj, last, reward, done, terminated, truncated, episode_reward, step_count = columns
        return TensorDict({
            "observation": obs, "action": action, "is_init": is_init, ("collector", "traj_ids"): traj,
            "step_count": step_count - 1,
            "next": {"observation": last, "reward": reward, "done": done, "terminated": terminated,
                     "truncated": truncated, "episode_reward": episode_reward, "step_count": step_count,
                     "policy_version": torch.full((n, steps), self.version, dtype=torch.int64)},
        }, batch_size=[n, steps])

    def shutdown(self) -> None:
        self.envs.close()
        self.spec_env.close()
