"""SAC (Haarnoja et al. 2018) on torchrl's ``SACLoss``: a tanh-Gaussian actor sampled for collection, two Q
networks with soft targets, an automatically tuned entropy temperature."""
from __future__ import annotations

from dataclasses import dataclass

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import DeterministicActor, DeterministicTanhNormal


def build(cfg, env, device) -> AlgoParts:
    from torchrl.objectives import SACLoss

    obs_spec, action_spec = nets.specs(env)
    actor = nets.tanh_normal_actor(cfg.model, obs_spec, action_spec)
    loss = nets.with_value_estimator(cfg.loss, SACLoss(
        actor, nets.qvalue(cfg.model, obs_spec, action_spec.shape[-1]), num_qvalue_nets=2,
        loss_function=cfg.loss.function,
        alpha_init=cfg.sac.alpha_init, fixed_alpha=cfg.sac.fixed_alpha, target_entropy=nets.target_entropy(cfg.sac),
        action_spec=action_spec, deactivate_vmap=nets.DEACTIVATE_VMAP))
    groups = nets.actor_critic_groups(cfg.optim, cfg.compile, loss, loss.qvalue_network_params, "loss_qvalue")
    return AlgoParts(
        collect_policy=actor, eval_policy=DeterministicActor(actor), eval_tensor_policy=DeterministicTanhNormal(actor),
        exploration=None, loss=loss,
        groups=groups + nets.alpha_group(cfg.compile, loss, cfg.sac),
        target_updater=nets.target_updater(cfg.target, loss), td_error_squared=False,
        exploration_value=nets.alpha_value(loss),
    )


@dataclass
class SACConfig(nets.TemperatureConfig):
    """SAC's section"""


ALGORITHM = Algorithm(name="sac", discrete=False, smoke_env="Pendulum-v1", build=build, config=SACConfig)
