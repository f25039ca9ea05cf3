"""TD3 (Fujimoto et al. 2018) on torchrl's ``TD3Loss``: a deterministic actor with action noise for collection, two
Q networks, target policy smoothing, and the actor and the targets moving every ``td3.policy_delay`` critic steps."""
from __future__ import annotations

from dataclasses import dataclass

from torchrl.objectives import TD3Loss

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import SquashedActor, noisy_policy
from shared import compat
from shared.schema import key


class FirstQTD3Loss(TD3Loss):
    """torchrl's TD3Loss whose actor loss runs only the first Q network, the one whose value it keeps: torchrl 0.14.1
    also runs the second, forward and backward, and discards it (shared/compat.py)."""

    def actor_loss(self, tensordict):
        return compat.td3_actor_loss_on_first_q(self, tensordict)


def make_loss(cfg, actor, critic, action_spec):
    """torchrl's TD3Loss over ``actor`` and ``critic`` (its actor loss on the first Q network only), with the target
    smoothing noise per action dimension."""
    loss = FirstQTD3Loss(actor, critic, action_spec=action_spec, num_qvalue_nets=2,
                         loss_function=cfg.loss.function, deactivate_vmap=nets.DEACTIVATE_VMAP)
    # target smoothing in units of each dimension's half range, as the TD3 paper (0.2 and 0.5 x max_action) and as
    # the exploration noise here; torchrl's policy_noise and noise_clip are absolute. TD3Loss scales and clamps its
    # noise with them as given, so per-dimension tensors work; as buffers they follow the loss to its device, and
    # non-persistent ones leave the checkpoint's keys as they were (they come from the config)
    half_range = (action_spec.space.high - action_spec.space.low) / 2
    for name, scale in (("policy_noise", cfg.td3.target_noise), ("noise_clip", cfg.td3.noise_clip)):
        delattr(loss, name)
        loss.register_buffer(name, scale * half_range, persistent=False)
    return nets.with_value_estimator(cfg.loss, loss)


def build(cfg, env, device) -> AlgoParts:
    obs_spec, action_spec = nets.specs(env)
    actor = nets.continuous_actor(cfg.model, obs_spec, action_spec)
    noise = nets.noise(cfg.td3, action_spec, cfg.td3.anneal_env_steps, cfg.collector.prefill_env_steps)
    loss = make_loss(cfg, actor, nets.qvalue(cfg.model, obs_spec, action_spec.shape[-1]), action_spec)
    groups = nets.actor_critic_groups(cfg.optim, cfg.compile, loss, loss.qvalue_network_params, "loss_qvalue",
                                      actor_every=cfg.td3.policy_delay, targets_follow_actor=True)
    return AlgoParts(
        collect_policy=noisy_policy(actor, noise), eval_policy=actor, eval_tensor_policy=SquashedActor(actor),
        exploration=noise, loss=loss,
        groups=groups, target_updater=nets.target_updater(cfg.target, loss),
        critic_only=nets.critic_only(loss.value_loss, ensemble_td_error=True),
        exploration_value=nets.noise_value(noise),
    )


@dataclass
class TD3Config(nets.NoiseConfig):
    """TD3's section"""

    random_prefill: bool = key(True, nets.RANDOM_PREFILL_DOC)
    policy_delay: int = key(2, "actor and target updates every this many critic steps", min=1, integer=True)
    target_noise: float = key(0.2, "target policy smoothing noise std, in units of half the action range (TD3 paper: "
                                   "0.2 x max_action)", min=0)
    noise_clip: float = key(0.5, "clip of the target smoothing noise, same units (0.5 x max_action)", min=0)


ALGORITHM = Algorithm(name="td3", discrete=False, smoke_env="Pendulum-v1", build=build, config=TD3Config)
