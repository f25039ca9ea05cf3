"""What an algorithm module declares (:class:`Algorithm`) and what its builder returns (:class:`AlgoParts`): the only
contract between an algorithm and the rest of the engine. The loop, the learner and the engines never branch on the
algorithm's name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn

from offpolicy.network_updates import OptimGroup, TargetUpdate
from shared.config import ConfigError


@runtime_checkable
class ActsOnTensors(Protocol):
    """A collection policy that can also act on plain tensors, ``act(observation [n, d]) -> action [n, ...]`` as its
    TensorDict path writes ``"action"``, for the lean collector (offpolicy/collect/lean.py)."""

    def act(self, observation: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class DrawsAhead(Protocol):
    """A discrete collection policy whose randomness is drawn for a whole batch ahead: ``draw(steps, n)`` once per
    batch, then ``act_index(observation [n, d], draws, t) -> action indices [n]`` (numpy) at each step ``t``; the
    lean collector makes the one-hot actions once per batch."""

    n_actions: int

    def draw(self, steps: int, n: int): ...

    def act_index(self, observation: torch.Tensor, draws, t: int) -> np.ndarray: ...


def anneal(exploration: nn.Module, env_steps: int) -> None:
    """Anneal torchrl's epsilon-greedy, Gaussian or OU exploration module by ``env_steps`` in one update: the value
    torchrl's ``step(env_steps)`` reaches, ``max(end, value - env_steps (init - end) / annealing_num_steps)``. Why not
    ``step``: it runs ``env_steps`` small tensor updates (torchrl 0.14.1), a cost per collected env step. An action
    noise's uniform prefill (``random_env_steps_left``, offpolicy/algos/networks.py ``noise``) counts down with it."""
    name = "sigma" if hasattr(exploration, "sigma_init") else "eps"  # Gaussian noise; epsilon-greedy and OU: eps
    value, init, end = (getattr(exploration, f"{name}{suffix}") for suffix in ("", "_init", "_end"))
    value.data.copy_(torch.maximum(end, value - env_steps * (init - end) / exploration.annealing_num_steps))
    random_left = getattr(exploration, "random_env_steps_left", None)  # action noise: its uniform prefill
    if random_left is not None:
        random_left.copy_((random_left - env_steps).clamp(min=0))


@dataclass
class AlgoParts:
    """The algorithm's parts, built from the config and the env's specs."""

    collect_policy: nn.Module  # what the collector runs: stochastic (samples, noise or epsilon-greedy)
    eval_policy: nn.Module  # deterministic: the loss's actor (greedy Q network for DQN)
    # the evaluation policy on plain tensors, ``observation [n, ...] -> action`` (a discrete action as its index),
    # sharing its networks: what offpolicy.export writes. The algorithm declares it with its policy (policies.py has
    # those of today's algorithms), so nothing guesses it from the policy's class
    eval_tensor_policy: nn.Module
    exploration: nn.Module | None  # annealed by collected env steps, published with the actor (None for SAC)
    loss: nn.Module
    groups: list[OptimGroup]  # one optimiser per network, checkpointed by name; a group's ``moves_targets`` says
    #                           whether its steps move the target networks (TD3: only the actor's)
    target_updater: TargetUpdate | None  # None: the loss has no target networks (CrossQ)
    # on steps where only the critic is due: ``sample -> (critic loss, |TD error| per sample)``, skipping the actor
    # loss's forward (TD3, CrossQ, REDQ); None: the whole loss every step
    critic_only: Callable[[object], tuple[torch.Tensor, torch.Tensor]] | None = None
    critic_loss_key: str = "loss_qvalue"
    td_error_squared: bool = True  # torchrl's DQN, DDPG and TD3 losses write (delta)^2 as "td_error", SAC |delta|
    exploration_value: Callable[[], float] = lambda: 0.0  # current epsilon / sigma / alpha, for train/ metrics
    discrete: bool = False
    describe: str = ""  # what the start line says of these parts beyond the config's keys (DQN: its CNN's precision)

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {g.name: g.optimizer for g in self.groups}

    def action_bounds(self, action_spec) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Low and high action bounds (None for discrete actions), for the action statistics."""
        if self.discrete:
            return None
        return action_spec.space.low.float(), action_spec.space.high.float()


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as its module declares it (``ALGORITHM = Algorithm(...)``)."""

    name: str
    discrete: bool  # action space: discrete (one-hot, e.g. CartPole, ALE games) or bounded continuous
    smoke_env: str  # the env of its smoke runs (``offpolicy.tools.suite profile=*smoke``)
    # (cfg, anything with torchrl ``*_spec_unbatched``, the learner's torch.device) -> parts
    build: Callable[[DictConfig, object, torch.device], AlgoParts]
    # its config section ``<name>``: a dataclass declaring each key (default, rule, doc; shared/schema.py) and its
    # checks across them
    config: type
    shape_keys: tuple[str, ...] = ()  # its keys that shape its networks: a resume cannot change them
    # whether its loss runs under torch.compile; False: compile.enabled=auto stays eager and true is a config error
    compiles: bool = True
    # what its loss writes as each sample's priority ("td_error"): "td_error", |delta| of the Q regression (Schaul
    # et al.), or "loss", the sample's own loss (a distributional cross-entropy, as Rainbow prioritises)
    priority: str = "td_error"

    def check_actions(self, env_name: str, action_spec) -> None:
        """The env's actions suit the algorithm: discrete (one-hot) or bounded continuous; a ConfigError otherwise.
        (Observations were checked with the name: shared/envs.py check_gym_name.)"""
        from torchrl.data import Bounded, OneHot

        if self.discrete and not isinstance(action_spec, OneHot):
            raise ConfigError(f"env.name={env_name!r} has continuous actions; allowed for {self.name}: a "
                              "discrete-action env (CartPole-v1, an ALE game such as Pong)")
        if not self.discrete and not isinstance(action_spec, Bounded):
            raise ConfigError(f"env.name={env_name!r} has no bounded continuous actions; allowed for {self.name}: "
                              "HalfCheetah-v5, Pendulum-v1, Hopper-v5, Humanoid-v5 or another Box-action env")
