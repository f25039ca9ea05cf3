"""Collection policies that also act on plain tensors (``act(observation) -> action``,
:class:`~offpolicy.algos.base.ActsOnTensors`) beside their TensorDict path: torchrl's modules, subclassed, with a
method that reads the same networks and buffers. torchrl's Collector runs the TensorDict path; the lean collector
(offpolicy/collect/lean.py) runs ``act`` (DQN's: ``draw`` once per batch, then ``act_index`` per step).

Why a second path: at one env copy, a call through torchrl's TensorDict modules costs several times the networks'
own arithmetic per env step (``policy`` against ``tensor_policy`` in benchmarks/offpolicy_collection_cost.py).
Tests hold each ``act`` to its TensorDict path (tests/test_offpolicy_lean_collection.py).

:class:`DeterministicActor` is the evaluation policy of the stochastic actors (SAC, CrossQ, REDQ). The evaluation
policies' forms on plain tensors (what ``offpolicy.export`` writes) are here too: :class:`GreedyQ`,
:class:`SquashedActor`, :class:`DeterministicTanhNormal`; each algorithm module names its own
(:attr:`~offpolicy.algos.base.AlgoParts.eval_tensor_policy`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch import nn
from torch.nn import functional as F
from torchrl.envs.utils import ExplorationType, exploration_type
from torchrl.modules import AdditiveGaussianModule, ProbabilisticActor

from shared.models import chained_forward


@dataclass
class EpsilonDraws:
    """A batch's epsilon-greedy randomness, drawn ahead (numpy ``[steps, n]`` each): which copies explore at each
    step, and the uniformly random action of each; ``greedy`` is the Q network's forward for the steps that need it."""

    explore: np.ndarray
    random_action: np.ndarray
    greedy: Callable[[torch.Tensor], torch.Tensor]


class EpsilonGreedyPolicy(TensorDictSequential):
    """DQN's collection policy: torchrl's ``QValueActor`` then its ``EGreedyModule``, plus :meth:`act` and the
    draw-ahead pair :meth:`draw` / :meth:`act_index` that the lean collector runs."""

    def __init__(self, qvalue_actor, greedy, n_actions: int):
        super().__init__(qvalue_actor, greedy)
        self.n_actions = n_actions

    def draw(self, steps: int, n: int) -> EpsilonDraws:
        """The randomness of ``steps`` steps of ``n`` copies at the current epsilon, in two draws instead of two per
        step. Why ahead: the draws do not depend on the observations, and drawn per step (draw, compare, check, select)
        they cost as much as a CartPole simulator step (epsilon changes only between batches, when the loop anneals
        it)."""
        qvalue_actor, greedy = self.module
        explore = (torch.rand(steps, n) < greedy.eps).numpy()
        random_action = torch.randint(self.n_actions, (steps, n)).numpy()
        # the plain network inside the QValueActor's TensorDictModule, its layers called directly
        return EpsilonDraws(explore, random_action, chained_forward(qvalue_actor.module[0].module))

    @staticmethod
    def act_index(observation: torch.Tensor, draws: EpsilonDraws, t: int) -> np.ndarray:
        """Step ``t``'s action indices ``[n]`` for state vectors ``[n, d]``: the drawn random action where the copy
        explores, else the argmax of its Q values. When every copy explores the network is not run (CleanRL's
        shortcut; the actions do not depend on it)."""
        explore, random_action = draws.explore[t], draws.random_action[t]
        if explore.all():
            return random_action
        return np.where(explore, random_action, draws.greedy(observation).argmax(-1).numpy())

    def act(self, observation: torch.Tensor) -> torch.Tensor:
        """One-hot actions ``[n, A]`` (int64, as the TensorDict path writes them) for state vectors ``[n, d]``: each
        copy takes a uniformly random action with probability ``eps``, else the argmax of its Q values."""
        index = self.act_index(observation, self.draw(1, observation.shape[0]), 0)
        return F.one_hot(torch.from_numpy(index), self.n_actions)


def _squashed(actor: TensorDictSequential, observation: torch.Tensor) -> torch.Tensor:
    """:func:`~offpolicy.algos.networks.continuous_actor`'s action on tensors: its network, then its ``TanhModule``'s
    map into the bounds (built without ``clamp``)."""
    network, squash = actor.module
    feature = network.module(observation).tanh()
    return squash.action_low + (squash.action_high - squash.action_low) * (feature + 1) / 2


class TanhNormalActor(ProbabilisticActor):
    """:func:`~offpolicy.algos.networks.tanh_normal_actor`'s class: torchrl's ``ProbabilisticActor`` plus
    :meth:`act`."""

    def distribution(self, observation: torch.Tensor):
        """The action distribution for observations ``[n, ...]``, built from the network and the sampler's class and
        kwargs (no TensorDict, no exploration type)."""
        params, sampler = self.module
        loc, scale = params.module(observation)
        return sampler.distribution_class(loc, scale, **sampler.distribution_kwargs)

    def act(self, observation: torch.Tensor) -> torch.Tensor:
        """A sampled action ``[n, A]`` for observations ``[n, ...]``."""
        return self.distribution(observation).sample()


class NoisyActor(TensorDictSequential):
    """:func:`~offpolicy.algos.networks.continuous_actor` then torchrl's action noise (TD3, DDPG). While the noise
    module's ``random_env_steps_left`` is above zero (a ``random_prefill``), the action is drawn uniformly in the
    action bounds instead (under the RANDOM exploration type, where the noise applies); the actor and the noise still
    run, so their state (OU's process) and the random draws before the uniform one are those of the noisy path.
    torchrl's noise modules have no uniform warm-up (0.14.1)."""

    def forward(self, tensordict, *args, **kwargs):
        tensordict = super().forward(tensordict, *args, **kwargs)
        noise = self.module[-1]
        if noise.random_env_steps_left > 0 and exploration_type() in (ExplorationType.RANDOM, None):
            tensordict.set(noise.action_key, noise.spec[noise.action_key].rand(tensordict.batch_size))
        return tensordict


class GaussianNoiseActor(NoisyActor):
    """:class:`NoisyActor` with torchrl's ``AdditiveGaussianModule``, plus :meth:`act`."""

    def act(self, observation: torch.Tensor) -> torch.Tensor:
        """The deterministic action plus Gaussian noise (mean, std and the annealed sigma of the noise module),
        projected into the action bounds, ``[n, A]``; uniformly random in the bounds while the noise module's
        ``random_env_steps_left`` is above zero."""
        actor, noise = self.module
        action = _squashed(actor, observation)
        action = action + torch.normal(noise.mean.expand(action.shape), noise.std.expand(action.shape)) * noise.sigma
        if noise.random_env_steps_left > 0:
            return noise.spec["action"].rand(action.shape[:-1])
        return noise.spec["action"].project(action)


def noisy_policy(actor: TensorDictSequential, noise: nn.Module | None) -> nn.Module:
    """The collection policy of a deterministic ``actor`` with action ``noise``: Gaussian noise gets the
    plain-tensor path; OU noise keeps its process state in the TensorDict, so it runs there."""
    if noise is None:
        return actor
    if isinstance(noise, AdditiveGaussianModule):
        return GaussianNoiseActor(actor, noise)
    return NoisyActor(actor, noise)


class DeterministicActor(TensorDictModuleBase):
    """A :class:`TanhNormalActor`'s evaluation policy: the deterministic sample of its distribution (what torchrl's
    DETERMINISTIC exploration type gives), computed without tensordict's exploration type. Why: tensordict 0.14.3 keeps
    that type in one process-wide variable (its ``get_dist`` sets it too), so the evaluator thread's DETERMINISTIC
    leaked into the training thread (a compiled learner step recompiled on it) and the losses' RANDOM into
    evaluation."""

    def __init__(self, actor: TanhNormalActor):
        super().__init__()
        self.actor = actor
        self.in_keys = list(actor.module[0].in_keys)
        self.out_keys = ["action"]

    def forward(self, tensordict):
        observation = tensordict.get(self.in_keys[0])
        tensordict.set("action", self.actor.distribution(observation).deterministic_sample)
        return tensordict


class GreedyQ(nn.Module):
    """DQN's evaluation policy (torchrl's ``QValueActor``) on tensors: the index ``[n]`` (int64) of the largest Q
    value, where the TensorDict path writes that action one-hot."""

    def __init__(self, qvalue_actor):
        super().__init__()
        self.q_network = qvalue_actor.module[0].module

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.q_network(observation).argmax(-1)


class SquashedActor(nn.Module):
    """:func:`~offpolicy.algos.networks.continuous_actor` (TD3's and DDPG's evaluation policy) on tensors: the action
    ``[n, A]`` in the action bounds."""

    def __init__(self, actor: TensorDictSequential):
        super().__init__()
        self.actor = actor

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return _squashed(self.actor, observation)


class DeterministicTanhNormal(nn.Module):
    """A :class:`TanhNormalActor`'s :class:`DeterministicActor` (SAC's, CrossQ's and REDQ's evaluation policy) on
    tensors: the action ``[n, A]``.
    It computes what torchrl 0.14.1's ``TanhNormal.deterministic_sample`` gives for the distribution
    :meth:`TanhNormalActor.distribution` builds (``safe_tanh``, bounds ``low``/``high``): the tanh of the mean,
    clamped to +-(1 - float resolution), mapped affinely onto the bounds. Why not that method: its clamped tanh is a
    Python autograd function, which TorchScript cannot save."""

    def __init__(self, actor: TanhNormalActor):
        super().__init__()
        params, sampler = actor.module
        self.network = params.module
        low, high = sampler.distribution_kwargs["low"], sampler.distribution_kwargs["high"]
        self.register_buffer("middle", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        loc, _ = self.network(observation)
        limit = 1.0 - torch.finfo(loc.dtype).resolution
        return self.middle + self.half_range * loc.tanh().clamp(-limit, limit)
