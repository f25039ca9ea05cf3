"""Local collection for Gymnasium state-vector envs without torchrl's ``Collector`` (``collector.lean=true``).

Why our own: at one CartPole env, torchrl's GymEnv, its transforms and the Collector cost tens of times the simulator
step itself (benchmarks/offpolicy_collection_cost.py; by cProfile, tensordict and torchrl Python work on every step). Here the Gymnasium env copies are stepped in a loop into numpy arrays, the policy (the same torchrl
modules) acts on plain tensors where it can (:class:`~offpolicy.algos.base.DrawsAhead`: DQN's epsilon-greedy, its
randomness drawn once per batch; :class:`~offpolicy.algos.base.ActsOnTensors`; else one small TensorDict per step),
the episode bookkeeping is done once per batch, and each batch becomes one TensorDict with the keys the engine reads
from a Collector's batch: replay, losses, statistics and invariants are unchanged. ALE games, dm_control, pixels, envpool and process-parallel
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

from offpolicy.algos.base import ActsOnTensors, DrawsAhead
from shared.env_guard import make_gym


def lean_collection(cfg: DictConfig, policy_on_cpu: bool = True) -> bool:
    """Whether a collector (the local engine's, or each Ray collector actor's) is a :class:`LeanCollector`:
    ``collector.lean``, a Gymnasium state-vector env stepped in the collector's process, and the policy on the CPU
    (``policy_on_cpu``, the engine's answer: a Ray collector with a GPU runs torchrl's Collector)."""
    return bool(cfg.collector.lean and cfg.env.backend == "gymnasium"
                and cfg.env.kind == "gymnasium" and not cfg.env.from_pixels
                and (cfg.env.num_envs == 1 or cfg.env.vector == "serial") and policy_on_cpu)


def torchrl_env_copies(cfg: DictConfig, policy_on_cpu: bool = True) -> int:
    """The torchrl training env copies a collector needs: all ``env.num_envs`` when torchrl's Collector steps them;
    one when our lean collector steps Gymnasium copies of its own (it reads only the torchrl env's specs and
    observation statistics)."""
    return 1 if lean_collection(cfg, policy_on_cpu) else cfg.env.num_envs


class LeanCollector:
    """Batches of ``env_steps_per_batch`` transitions, ``[num_envs, T]``, from the stochastic ``policy``.

    Offers what the local engine uses of torchrl's ``Collector``: iteration, ``update_policy_weights_()`` (the
    policy is shared, so publishing bumps the version), ``policy_version``, ``policy_version_tracker.version`` and
    ``shutdown()``. ``spec_env`` (the torchrl training env, read for its specs and observation statistics) is closed
    on shutdown, as the Collector closes its env.

    A step only acts, steps the copies and writes their results into the batch's preallocated numpy arrays; the
    episode bookkeeping (``is_init``, step counts, episode returns, trajectory ids) is computed for the whole batch at
    its end, and the batch becomes tensors once. Why: at one CartPole copy the small per-step array operations were
    half of a collection step (benchmarks/offpolicy_collection_cost.py).
    """

    def __init__(self, cfg: DictConfig, spec_env, policy, seed: int, obs_norm: dict | None, env_steps_per_batch: int):
        from torchrl.data import OneHot

        n = cfg.env.num_envs
        self.spec_env, self.policy = spec_env, policy
        # how the policy acts: randomness drawn per batch with integer actions (DQN), on plain tensors (SAC, TD3,
        # DDPG with Gaussian noise), or on one small TensorDict per step (OU noise keeps its process state there)
        self.mode = "draws" if isinstance(policy, DrawsAhead) else "act" if isinstance(policy, ActsOnTensors) else "td"
        self.steps = env_steps_per_batch // n
        # the copies stepped in a loop here, not by Gymnasium's SyncVectorEnv: its step adds work per call (info dicts
        # merged, observations copied), a quarter of a CartPole collection step
        self.envs = [make_gym(cfg.env.name) for _ in range(n)]  # a failure of the env is an EnvFault
        self.observation = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
                                    ).astype(np.float32)  # torchrl's DoubleToFloat
        self.norm = (obs_norm["loc"], obs_norm["scale"]) if obs_norm is not None else None
        # one-hot actions (torchrl's OneHot spec, DQN) -> the env's integer actions
        self.discrete = isinstance(spec_env.action_spec_unbatched, OneHot)
        # per-copy episode state carried from batch to batch
        self.episode_reward = np.zeros(n, dtype=np.float32)
        self.step_count = np.zeros(n, dtype=np.int64)
        self.is_init = np.ones(n, dtype=bool)
        self.traj_ids = np.arange(n)
        self.next_traj_id = n
        self.noise_state: dict[str, torch.Tensor] = {}
        self.version = 0
        self.policy_version_tracker = self  # torchrl's Collector keeps the version on its tracker

    def _normalised(self, observation: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            observation = (observation - self.norm[0]) / self.norm[1]
        return observation

    @property
    def policy_version(self) -> int:
        return self.version

    def update_policy_weights_(self) -> None:
        self.version += 1

    def __iter__(self):
        while True:
            yield self.collect()

    def _action(self, observation: torch.Tensor, draws, t: int, is_init: np.ndarray):
        """Step ``t``'s actions: numpy, what the envs step with (indices for discrete actions)."""
        if self.mode == "draws":
            return self.policy.act_index(observation, draws, t)
        if self.mode == "act":
            action = self.policy.act(observation)
        else:
            n = observation.shape[0]
            td = TensorDict({"observation": observation, "is_init": torch.from_numpy(is_init).reshape(n, 1),
                             **self.noise_state}, [n])
            td = self.policy(td)
            # OU noise keeps its process state in the tensordict ("_ou_*"): carried to the next step, as the
            # Collector's step_mdp carries it
            self.noise_state = {k: td[k] for k in td.keys() if isinstance(k, str) and k.startswith("_")}
            action = td["action"]
        return (action.argmax(-1) if self.discrete else action).numpy()

    def collect(self) -> TensorDict:
        """One batch ``[num_envs, T]`` from the current policy."""
        from torchrl.envs.utils import ExplorationType, set_exploration_type

        n, steps, envs = len(self.envs), self.steps, self.envs
        obs = np.empty((steps + 1, n, self.observation.shape[-1]), dtype=np.float32)  # row t + 1: after step t
        last = np.empty_like(obs[:steps])  # the step's own next observation (an ended episode's final one)
        reward = np.empty((steps, n), dtype=np.float32)
        terminated, truncated = np.empty((steps, n), dtype=bool), np.empty((steps, n), dtype=bool)
        actions = []
        obs[0] = self.observation
        is_init = self.is_init
        # inference mode: the policy's per-step tensors are never part of a graph (the batch is built outside it)
        with torch.inference_mode(), set_exploration_type(ExplorationType.RANDOM):
            draws = self.policy.draw(steps, n) if self.mode == "draws" else None
            for t in range(steps):
                action = self._action(self._normalised(torch.from_numpy(obs[t])), draws, t, is_init)
                actions.append(action)
                for i, env in enumerate(envs):
                    o, r, term, trunc, _ = env.step(action[i])
                    last[t, i], reward[t, i], terminated[t, i], truncated[t, i] = o, r, term, trunc
                    obs[t + 1, i] = env.reset()[0] if term or trunc else o  # Gymnasium's same-step autoreset
                if self.mode == "td":
                    is_init = terminated[t] | truncated[t]
        self.observation = obs[steps]
        action = np.stack(actions)  # [T, n, ...]
        if self.discrete:
            action = np.eye(self.spec_env.action_spec_unbatched.shape[-1], dtype=np.int64)[action]  # one-hot
        return self._batch(obs[:steps], action, last, reward, terminated, truncated)

    def _batch(self, obs, action, last, reward, terminated, truncated) -> TensorDict:
        """The batch's TensorDict ``[n, T]`` from its ``[T, n, ...]`` arrays, with the episode bookkeeping of the
        whole batch, and the per-copy state carried to the next batch."""
        steps, n = reward.shape
        done = terminated | truncated
        is_init = np.concatenate([self.is_init[None], done[:-1]])
        t = np.arange(steps)[:, None]
        # step counts: 1 at an episode's first step, counted on from the carried count before the batch's first reset
        episode_start = np.maximum.accumulate(np.where(is_init, t, -1), axis=0)
        step_count = np.where(episode_start >= 0, t - episode_start + 1, self.step_count + t + 1)
        episode_reward = self._episode_returns(reward, is_init)
        # a new trajectory id for every episode that starts, numbered in (step, copy) order as they end
        new_id = np.where(done, self.next_traj_id + np.cumsum(done.reshape(-1)).reshape(done.shape) - 1, -1)
        traj_ids = np.maximum.accumulate(np.concatenate([self.traj_ids[None], new_id[:-1]]), axis=0)
        # carried: a copy whose episode ended starts the next batch at is_init, where the counts start again
        self.is_init, self.step_count, self.episode_reward = done[-1], step_count[-1], episode_reward[-1]
        self.traj_ids = np.where(done[-1], new_id[-1], traj_ids[-1])
        self.next_traj_id += int(done.sum())

        def tensor(array):  # [T, n, ...] -> [n, T, ...]
            return torch.from_numpy(np.ascontiguousarray(np.swapaxes(array, 0, 1)))

        def column(array):  # [T, n] -> [n, T, 1]
            return tensor(array).unsqueeze(-1)

        return TensorDict({
            "observation": self._normalised(tensor(obs)), "action": tensor(action), "is_init": column(is_init),
            ("collector", "traj_ids"): tensor(traj_ids), "step_count": column(step_count - 1),
            "next": {"observation": self._normalised(tensor(last)), "reward": column(reward), "done": column(done),
                     "terminated": column(terminated), "truncated": column(truncated),
                     "episode_reward": column(episode_reward), "step_count": column(step_count),
                     "policy_version": torch.full((n, steps), self.version, dtype=torch.int64)},
        }, batch_size=[n, steps])

    def _episode_returns(self, reward: np.ndarray, is_init: np.ndarray) -> np.ndarray:
        """The running return of each step's episode, summed in float32 step by step as RewardSum does (the carried
        return continues where the batch's first step is not an episode's first)."""
        returns = np.empty_like(reward)
        for i in range(reward.shape[1]):
            starts = [0, *np.flatnonzero(is_init[1:, i]) + 1, len(reward)]
            for begin, end in zip(starts[:-1], starts[1:]):
                carried = self.episode_reward[i] if begin == 0 and not is_init[0, i] else np.float32(0)
                returns[begin:end, i] = np.cumsum(np.concatenate([[carried], reward[begin:end, i]]))[1:]
        return returns

    def shutdown(self) -> None:
        for env in self.envs:
            env.close()
        self.spec_env.close()
