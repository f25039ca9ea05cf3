"""REDQ (Chen et al. 2021) on torchrl's ``REDQLoss``: SAC with an ensemble of ``redq.num_qvalue_nets`` critics (10)
whose target is the minimum over ``redq.sub_sample_len`` (2) of them drawn at random for each step, a high
update-to-data ratio (the paper's 20), and the actor and the temperature stepping once per collected env step
(every ``utd_ratio`` critic steps), as the paper's Algorithm 1."""
from __future__ import annotations

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import DeterministicActor
from shared.config import Rule


def build(cfg, env) -> AlgoParts:
    from torchrl.objectives import REDQLoss

    obs_spec, action_spec = nets.specs(env)
    actor = nets.tanh_normal_actor(cfg.model, obs_spec, action_spec)
    nets.before_losses()
    loss = nets.with_value_estimator(cfg.loss, REDQLoss(
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
        collect_policy=actor, eval_policy=DeterministicActor(actor), exploration=None, loss=loss,
        groups=groups + nets.alpha_group(cfg.compile, loss, cfg.redq, every=actor_every),
        target_updater=nets.target_updater(cfg.target, loss),
        exploration_value=nets.alpha_value(loss),
    )


ALGORITHM = Algorithm(
    name="redq", discrete=False, smoke_env="Pendulum-v1", build=build, shape_keys=("redq.num_qvalue_nets",),
    rules={"redq.alpha_init": Rule(min=1e-9), "redq.alpha_lr": Rule(min=1e-12),
           "redq.num_qvalue_nets": Rule(min=2, integer=True), "redq.sub_sample_len": Rule(min=1, integer=True)},
)
