"""REDQ (Chen et al. 2021) on torchrl's ``REDQLoss``: SAC with an ensemble of ``redq.num_qvalue_nets`` critics (10)
whose target is the minimum over ``redq.sub_sample_len`` (2) of them drawn at random for each step, a high
update-to-data ratio (the paper's 20), and the actor and the temperature stepping once per collected env step
(every ``utd_ratio`` critic steps), as the paper's Algorithm 1."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives import REDQLoss
from torchrl.objectives.utils import distance_loss

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import DeterministicActor, DeterministicTanhNormal
from shared.config import ConfigError
from shared.schema import key


class SplitREDQLoss(REDQLoss):
    """torchrl's ``REDQLoss`` (its ensemble, target networks, temperature and value estimator) with the loss written
    as the critics' term (:meth:`qvalue_loss`) then the actor's and the temperature's (:meth:`forward`). Why, against
    torchrl 0.14.1's one ``forward``: its temperature loss averaged the log-probabilities of the actions sampled at the
    current and at the next states (the paper's: current states only); it ran the actor's term through all critics on
    every step, also on the steps where only the critics learn (19 of 20 at UTD 20), where the learner now calls
    :meth:`qvalue_loss` alone; and it dropped ``steps_to_next_obs``, so n-step targets were discounted by gamma once.
    The critics' term draws its random numbers first, so a critic-only step and a whole step make the same critic
    update from the same random state."""

    def _policy(self, params: TensorDictBase, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An action sampled (reparameterised) by the actor with ``params`` at ``observation``, and its log-prob."""
        with params.to_module(self.actor_network, preserve_module_state=False):
            return rsample_and_log_prob(self.actor_network.distribution(observation))

    def _critics(self, params: TensorDictBase, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q values ``[K, *batch]`` of the K critics stacked in ``params`` at the same state-action pairs."""
        def one(critic_params, observation, action):
            with critic_params.to_module(self.qvalue_network, preserve_module_state=False):
                return self.qvalue_network.module(observation, action).squeeze(-1)

        return torch.vmap(one, (0, None, None))(params, observation, action)

    def qvalue_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The critics' term: each of the N critics regresses on ``r + gamma^k (min_i Q'_i(s', a') - alpha log
        pi(a'|s'))`` (no bootstrap past a terminal step; ``k``: n-step replay's ``steps_to_next_obs``), the minimum
        over ``sub_sample_len`` target critics ``i`` drawn for this step, ``a' ~ pi(s')``. Returns the loss and ``td_error`` (squared, ``[N, *batch]``), ``target_value`` and the ``drawn`` critics."""
        observation, action = tensordict.get("observation"), tensordict.get(self.tensor_keys.action)
        drawn = torch.randperm(self.num_qvalue_nets)[: self.sub_sample_len]
        with torch.no_grad():
            next_observation = tensordict.get(("next", "observation"))
            next_action, next_log_prob = self._policy(self.actor_network_params, next_observation)
            next_q = self._critics(self.target_qvalue_network_params[drawn], next_observation, next_action)
            next_value = (next_q - self.alpha * next_log_prob).min(0).values
            target = self.value_estimator.value_estimate(tensordict, next_value=next_value.unsqueeze(-1)).squeeze(-1)
        q = self._critics(self.qvalue_network_params, observation, action)
        loss = distance_loss(q, target.expand_as(q), loss_function=self.loss_function).mean()
        td_error = (q - target).pow(2).detach()
        return loss, {"td_error": td_error, "target_value": target, "drawn": drawn}

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The critics' term, then the actor's (``alpha log pi(a|s) - Q_i(s, a)`` averaged over all N critics, whose
        parameters it does not train) and the temperature's (``-alpha (log pi(a|s) + target entropy)``) at actions
        ``a ~ pi(s)`` sampled at the current states. Writes the priority (the largest squared TD error) into
        ``tensordict``."""
        loss_qvalue, metadata = self.qvalue_loss(tensordict)
        tensordict.set(self.tensor_keys.priority, metadata["td_error"].max(0).values)
        observation = tensordict.get("observation")
        action, log_prob = self._policy(self.actor_network_params, observation)
        q = self._critics(self.qvalue_network_params.detach(), observation, action)
        alpha = self.alpha
        loss_actor = (alpha * log_prob - q).mean()
        loss_alpha = (-self.log_alpha.exp() * (log_prob.detach() + self.target_entropy)).mean()
        return TensorDict({"loss_actor": loss_actor, "loss_qvalue": loss_qvalue, "loss_alpha": loss_alpha,
                           "alpha": alpha, "entropy": -log_prob.detach().mean()}, [])


def build(cfg, env, device) -> AlgoParts:
    obs_spec, action_spec = nets.specs(env)
    actor = nets.tanh_normal_actor(cfg.model, obs_spec, action_spec)
    loss = nets.with_value_estimator(cfg.loss, SplitREDQLoss(
        actor, nets.qvalue(cfg.model, obs_spec, action_spec.shape[-1]), num_qvalue_nets=cfg.redq.num_qvalue_nets,
        sub_sample_len=cfg.redq.sub_sample_len, loss_function=cfg.loss.function, alpha_init=cfg.redq.alpha_init,
        # torchrl clamps alpha to [0.1, 10] by default; the paper tunes it freely (Pendulum settles near 0.02)
        min_alpha=1e-8, max_alpha=1e8,
        fixed_alpha=cfg.redq.fixed_alpha, target_entropy=nets.target_entropy(cfg.redq), action_spec=action_spec))
    # torchrl 0.14.1's REDQLoss registers its target-entropy buffer on first use: make it now, so a fresh loss
    # has the keys of a checkpoint's
    loss.target_entropy
    actor_every = max(1, round(cfg.optim.utd_ratio))  # once per collected env step
    groups = nets.actor_critic_groups(cfg.optim, cfg.compile, loss, loss.qvalue_network_params, "loss_qvalue",
                                      actor_every=actor_every)
    return AlgoParts(
        collect_policy=actor, eval_policy=DeterministicActor(actor), eval_tensor_policy=DeterministicTanhNormal(actor),
        exploration=None, loss=loss,
        groups=groups + nets.alpha_group(cfg.compile, loss, cfg.redq, every=actor_every),
        target_updater=nets.target_updater(cfg.target, loss),
        critic_only=nets.critic_only(loss.qvalue_loss, ensemble_td_error=True),
        exploration_value=nets.alpha_value(loss),
    )


@dataclass
class REDQConfig(nets.TemperatureConfig):
    """REDQ's section"""

    num_qvalue_nets: int = key(10, "N: critics in the ensemble", min=2, integer=True)
    sub_sample_len: int = key(2, "M: critics drawn for each step's target minimum (at most num_qvalue_nets - 1)",
                              min=1, integer=True)
    alpha_lr: float = key(0.0003, "temperature learning rate", min=1e-12)

    @staticmethod
    def check(cfg) -> None:
        """``redq.sub_sample_len`` draws from the ensemble and leaves a critic out (torchrl would cap it silently)."""
        n, m = cfg.redq.num_qvalue_nets, cfg.redq.sub_sample_len
        if not m < n:
            raise ConfigError(f"redq.sub_sample_len={m} is out of range; allowed: an integer from 1 to "
                              f"redq.num_qvalue_nets - 1 = {n - 1}")


ALGORITHM = Algorithm(name="redq", discrete=False, smoke_env="Pendulum-v1", build=build, config=REDQConfig,
                      shape_keys=("redq.num_qvalue_nets",))
