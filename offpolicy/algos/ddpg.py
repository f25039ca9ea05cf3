"""DDPG (Lillicrap et al. 2016) on torchrl's ``DDPGLoss``: a deterministic actor with Gaussian or
Ornstein-Uhlenbeck noise for collection, one Q network, target actor and critic."""
from __future__ import annotations

from dataclasses import dataclass

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import SquashedActor, noisy_policy
from shared.config import ConfigError
from shared.schema import key


def build(cfg, env, device) -> AlgoParts:
    from torchrl.objectives import DDPGLoss

    obs_spec, action_spec = nets.specs(env)
    actor = nets.continuous_actor(cfg.model, obs_spec, action_spec)
    noise = nets.noise(cfg.ddpg, action_spec, cfg.ddpg.anneal_env_steps, cfg.collector.prefill_env_steps)
    loss = nets.with_value_estimator(cfg.loss, DDPGLoss(actor, nets.qvalue(cfg.model, obs_spec, action_spec.shape[-1]),
                                                   loss_function=cfg.loss.function, delay_actor=True,
                                                   delay_value=True))
    return AlgoParts(
        collect_policy=noisy_policy(actor, noise), eval_policy=actor, eval_tensor_policy=SquashedActor(actor),
        exploration=noise, loss=loss,
        groups=nets.actor_critic_groups(cfg.optim, cfg.compile, loss, loss.value_network_params, "loss_value"),
        target_updater=nets.target_updater(cfg.target, loss), critic_loss_key="loss_value",
        exploration_value=nets.noise_value(noise),
    )


@dataclass
class DDPGConfig(nets.NoiseConfig):
    """DDPG's section"""

    noise: str = key("gaussian", "gaussian, ou (Ornstein-Uhlenbeck) or none", choices=("gaussian", "ou", "none"))
    sigma: float = key(0.2, "exploration noise std, in units of half the action range", min=1e-9)
    sigma_end: float = key(0.2, "annealed linearly to this...", min=0)

    @staticmethod
    def check(cfg) -> None:
        """A uniform prefill replaces the noisy actor's actions: without noise there is no such actor to replace."""
        if cfg.ddpg.random_prefill and cfg.ddpg.noise == "none":
            raise ConfigError("ddpg.random_prefill=True is not allowed with ddpg.noise=none; allowed: false, or "
                              "ddpg.noise=gaussian or ou")


ALGORITHM = Algorithm(name="ddpg", discrete=False, smoke_env="Pendulum-v1", build=build, config=DDPGConfig)
