"""CrossQ (Bhatt et al. 2024) on torchrl's ``CrossQLoss``: SAC without target networks. The critics batch-
renormalise their input and their hidden layers and see the current and the next state-action pairs in one forward
pass (so both share the batch statistics); the actor and the temperature step every ``crossq.policy_delay`` critic
steps; Adam with beta1 = 0.5; UTD 1. The hyper-parameters are torchrl's sota-implementations/crossq and the
authors' (lr 1e-3, betas (0.5, 0.999), policy delay 3, BatchRenorm momentum 0.01), with the input normalisation of the
authors' SBX critic: without it the critic did not learn Pendulum here. The batch renormalisation is torchrl's with
its warm-up ending (networks.ClampedBatchRenorm1d). Two differences from both recipes: the critics are
``model.hidden`` wide (256) where theirs are 2048 wide (over 20 times the update cost on a CPU), and the actor has no
normalisation where theirs is batch-renormalised too (so collection and evaluation need no train/eval switch);
docs/results.md (MuJoCo) has what they cost in returns."""
from __future__ import annotations

from dataclasses import dataclass

from functools import partial

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import DeterministicActor, DeterministicTanhNormal
from shared.schema import key


def build(cfg, env, device) -> AlgoParts:
    from torchrl.objectives import CrossQLoss

    obs_spec, action_spec = nets.specs(env)
    actor = nets.tanh_normal_actor(cfg.model, obs_spec, action_spec)
    norm = partial(nets.ClampedBatchRenorm1d, momentum=cfg.crossq.renorm_momentum,
                   warmup_steps=cfg.crossq.renorm_warmup_steps)
    critic = nets.qvalue(cfg.model, obs_spec, action_spec.shape[-1], norm=norm)
    loss = nets.with_value_estimator(cfg.loss, CrossQLoss(
        actor, critic, num_qvalue_nets=2, loss_function=cfg.loss.function, alpha_init=cfg.crossq.alpha_init,
        fixed_alpha=cfg.crossq.fixed_alpha, target_entropy=nets.target_entropy(cfg.crossq), action_spec=action_spec,
        deactivate_vmap=True))  # each critic's batch statistics from its own plain forward, not under vmap
    betas = (cfg.crossq.adam_beta1, 0.999)
    delay = cfg.crossq.policy_delay
    groups = nets.actor_critic_groups(cfg.optim, cfg.compile, loss, loss.qvalue_network_params, "loss_qvalue",
                                      actor_every=delay, betas=betas)
    return AlgoParts(
        collect_policy=actor, eval_policy=DeterministicActor(actor), eval_tensor_policy=DeterministicTanhNormal(actor),
        exploration=None, loss=loss,
        groups=groups + nets.alpha_group(cfg.compile, loss, cfg.crossq, every=delay), target_updater=None,
        critic_only=nets.critic_only(loss.qvalue_loss, ensemble_td_error=False), td_error_squared=False,
        exploration_value=nets.alpha_value(loss),
    )


@dataclass
class CrossQConfig(nets.TemperatureConfig):
    """CrossQ's section"""

    policy_delay: int = key(3, "actor and temperature step every this many critic steps", min=1, integer=True)
    adam_beta1: float = key(0.5, "Adam's beta1 for the actor and the critics (beta2 0.999)", min=0, max=0.999)
    renorm_momentum: float = key(0.01, "BatchRenorm1d running-statistics momentum", min=1e-6, max=1)
    renorm_warmup_steps: int = key(100000, "critic steps of plain batch normalisation before renormalisation (torchrl "
                                           "0.14.1's `BatchRenorm1d` never ends its warm-up, ours does: see the CrossQ "
                                           "results in [results.md](results.md#off-policy-engine))", min=0, integer=True)


ALGORITHM = Algorithm(name="crossq", discrete=False, smoke_env="Pendulum-v1", build=build, config=CrossQConfig)
