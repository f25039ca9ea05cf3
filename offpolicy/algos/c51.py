"""C51, distributional DQN (Bellemare et al. 2017), on torchrl's ``DistributionalQValueActor`` and
``DistributionalDQNLoss``: the Q network gives each action a categorical distribution over a fixed support of
returns, actions are the argmax of its mean, and the loss is the cross-entropy to the distributional Bellman target
projected onto the support (the next action chosen by the online network, as torchrl's loss does). Epsilon-greedy
collection; a hard or soft target network. Discrete actions: CartPole, ALE games (Nature CNN)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import EpsilonDraws, EpsilonGreedyPolicy
from offpolicy.network_updates import OptimGroup
from shared.config import ConfigError
from shared.schema import key


@dataclass
class C51Config(nets.EpsilonGreedyConfig):
    """C51's section"""

    atoms: int = key(51, "support points of each action's return distribution (the paper's 51)", min=2,
                     integer=True)
    v_min: float = key(0.0, "the support's lowest return", number=True)
    v_max: float = key(100.0, "the support's highest return (CartPole's discounted returns reach 1 / (1 - gamma) = "
                              "100; the paper's Atari support is -10 to 10 on clipped rewards)", number=True)

    @staticmethod
    def check(cfg) -> None:
        """A support that spans something; torchrl's loss computes its own one-step (or n-step) target with a
        cross-entropy, so the keys of other estimators and regressions would silently do nothing."""
        if not cfg.c51.v_min < cfg.c51.v_max:
            raise ConfigError(f"c51.v_min={cfg.c51.v_min} is not allowed; allowed: below c51.v_max={cfg.c51.v_max}")
        if cfg.loss.value_estimator != "td0":
            raise ConfigError(f"loss.value_estimator={cfg.loss.value_estimator} is not allowed for c51; allowed: td0 "
                              "(the distributional target is one step, or loss.n_steps)")
        if cfg.loss.function != "l2":
            raise ConfigError(f"loss.function={cfg.loss.function} is not allowed for c51; allowed: l2 (the default; "
                              "C51 minimises a cross-entropy, whatever this key says)")


class MeanQ(nn.Module):
    """The mean of each action's return distribution, ``observation [n, ...] -> [n, A]``: what the
    ``DistributionalQValueActor`` takes the argmax of, on plain tensors (the actor's network and support)."""

    def __init__(self, actor):
        super().__init__()
        self.actor = actor

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        logits = self.actor.module[0].module(observation)  # [n, atoms, A]
        return (logits.softmax(-2) * self.actor.support.unsqueeze(-1)).sum(-2)


class GreedyMeanQ(nn.Module):
    """C51's evaluation policy on tensors: the index ``[n]`` (int64) of the action with the largest mean return,
    where the TensorDict path writes it one-hot."""

    def __init__(self, actor):
        super().__init__()
        self.mean_q = MeanQ(actor)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.mean_q(observation).argmax(-1)


class DistributionalEpsilonGreedy(EpsilonGreedyPolicy):
    """The lean collector's draw-ahead epsilon-greedy over the distributional actor: greedy steps take the argmax of
    the mean return (:class:`MeanQ`), not of the network's raw output over atoms."""

    def __init__(self, actor, greedy, n_actions: int):
        super().__init__(actor, greedy, n_actions)
        self.mean_q = MeanQ(actor)

    def draw(self, steps: int, n: int) -> EpsilonDraws:
        draws = super().draw(steps, n)
        draws.greedy = self.mean_q
        return draws


def _distributional_loss():
    from torchrl.objectives import DistributionalDQNLoss

    class FlatPriorityLoss(DistributionalDQNLoss):
        """torchrl's loss, writing its per-sample priority (the cross-entropy) as ``[B]``, the shape the replay's
        priorities take, instead of ``[B, 1]``."""

        def forward(self, tensordict):
            out = super().forward(tensordict)
            tensordict.set("td_error", tensordict.get("td_error").reshape(-1))
            return out

    return FlatPriorityLoss


def build(cfg, env, device) -> AlgoParts:
    from torchrl.modules import DistributionalQValueActor, EGreedyModule

    obs_spec, action_spec = nets.specs(env)
    n_actions, section = action_spec.shape[-1], cfg.c51
    network = nn.Sequential(nets.q_network(cfg.model, obs_spec, section.atoms * n_actions, dueling=False),
                            nn.Unflatten(-1, (section.atoms, n_actions)))
    actor = DistributionalQValueActor(network, support=torch.linspace(section.v_min, section.v_max, section.atoms),
                                      in_keys=["observation"], spec=action_spec)
    greedy = EGreedyModule(action_spec, eps_init=section.eps_init, eps_end=section.eps_end,
                           annealing_num_steps=section.eps_anneal_env_steps)
    loss = _distributional_loss()(actor, gamma=cfg.loss.gamma, delay_value=True)
    optimizer = nets.network_adam(cfg.optim, cfg.compile, loss.value_network_params.flatten_keys().values(), "actor")
    return AlgoParts(
        collect_policy=DistributionalEpsilonGreedy(actor, greedy, n_actions), eval_policy=actor,
        eval_tensor_policy=GreedyMeanQ(actor), exploration=greedy, loss=loss,
        groups=[OptimGroup("q", optimizer, ("loss",), cfg.optim.max_grad_norm)],
        target_updater=nets.target_updater(cfg.target, loss), exploration_value=lambda: float(greedy.eps),
        discrete=True, td_error_squared=False,
    )


# compiles=False: torchrl 0.14.1's DistributionalDQNLoss reads its support with .item() and indexes with the online
# network's next actions inside data-dependent Python, which torch.compile does not trace (the compiled step failed:
# the next action came back None); priority="loss": its per-sample cross-entropy, not a TD error
ALGORITHM = Algorithm(name="c51", discrete=True, smoke_env="CartPole-v1", build=build, config=C51Config,
                      shape_keys=("c51.atoms",), compiles=False, priority="loss")
