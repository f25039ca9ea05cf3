"""Which parts each algorithm uses: networks, collection policy (with its exploration), torchrl loss, optimisers and
target networks. Where the parts run (in this process or on Ray) is the engine's job (offpolicy/engines/).

Every builder returns an :class:`AlgoParts`; the loop never branches on the algorithm.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from omegaconf import DictConfig
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn

from offpolicy.learner import SAMPLE_CHUNK, CompileOptions, Learner
from offpolicy.updates import OptimGroup, TargetUpdate
from shared import compat
from shared.models import AtariTrunk, DuelingHead, PixelEncoder, mlp

ALGOS = ("dqn", "sac", "ddpg", "td3")
ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}
# torchrl warns when a loss with target parameters has no torchrl updater attached; ours is updates.TargetUpdate
warnings.filterwarnings("ignore", message="No target network updater has been associated")


@dataclass
class AlgoParts:
    """The algorithm's parts, built from the config and the env's specs."""

    collect_policy: nn.Module  # what the collector runs: stochastic (samples, noise or epsilon-greedy)
    eval_policy: nn.Module  # deterministic: the loss's actor (greedy Q network for DQN)
    exploration: nn.Module | None  # annealed by collected env steps, published with the actor (None for SAC)
    loss: nn.Module
    groups: list[OptimGroup]  # one optimiser per network, checkpointed by name
    target_updater: TargetUpdate
    critic_only_method: str | None = None  # TD3: the critic loss alone, for steps where the actor is not due
    critic_loss_key: str = "loss_qvalue"
    targets_follow: str | None = None  # TD3: targets move only on steps that updated this optimiser's network
    td_error_squared: bool = True  # torchrl's DQN, DDPG and TD3 losses write (delta)^2 as "td_error", SAC |delta|
    exploration_value: Callable[[], float] = lambda: 0.0  # current epsilon / sigma / alpha, for train/ metrics
    discrete: bool = False

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {g.name: g.optimizer for g in self.groups}

    def action_bounds(self, action_spec) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Low and high action bounds (None for discrete actions), for the action statistics."""
        if self.discrete:
            return None
        return action_spec.space.low.float(), action_spec.space.high.float()


def build_parts(cfg: DictConfig, env) -> AlgoParts:
    """Build the parts of ``cfg.algo`` for ``env`` (anything with torchrl ``*_spec_unbatched``: only specs are
    read)."""
    return {"dqn": _dqn, "sac": _sac, "ddpg": _ddpg, "td3": _td3}[cfg.algo](cfg, env)


def make_learner(cfg: DictConfig, parts: AlgoParts, action_spec, *, sample_shape: tuple[int, ...],
                 grad_sync=None, chunk: int = SAMPLE_CHUNK, device: torch.device | None = None) -> Learner:
    """The learner over ``parts``: uniform replay is sampled ``chunk`` batches per call (prioritized and sliced
    replay one batch per call, as priorities change after every step)."""
    return Learner(parts.loss, parts.groups, parts.target_updater, sample_shape=sample_shape,
                   critic_only_method=parts.critic_only_method, critic_loss_key=parts.critic_loss_key,
                   targets_follow=parts.targets_follow, prioritized=cfg.replay.prioritized,
                   td_error_squared=parts.td_error_squared,
                   chunk=1 if cfg.replay.prioritized or cfg.replay.slice_len else chunk,
                   check_every=cfg.invariants.check_every, action_bounds=parts.action_bounds(action_spec),
                   grad_sync=grad_sync, device=device, compile=compile_options(cfg))


def compile_options(cfg: DictConfig) -> CompileOptions:
    """The ``compile`` section as the learner's options."""
    return CompileOptions(enabled=cfg.compile.enabled, mode=cfg.compile.mode, cudagraphs=cfg.compile.cudagraphs)


def make_loss(cfg: DictConfig, actor, critic, action_spec):
    """The algorithm's torchrl loss over ``actor`` and ``critic`` (the Q network; DQN has no actor), with its value
    estimator (TD(0), TD(1) or TD(lambda)): the one place where the ``loss`` section is read."""
    from torchrl.objectives import DDPGLoss, DQNLoss, SACLoss, TD3Loss, ValueEstimators

    compat.pseudo_vmap_without_pytree_edits()  # before the losses capture it: no recompiles of a compiled step
    fn = cfg.loss.function
    if cfg.algo == "dqn":
        loss = DQNLoss(critic, loss_function=fn, delay_value=True, double_dqn=cfg.dqn.double, action_space=action_spec)
    elif cfg.algo == "sac":
        target_entropy = "auto" if cfg.sac.target_entropy == "auto" else float(cfg.sac.target_entropy)
        loss = SACLoss(actor, critic, num_qvalue_nets=2, loss_function=fn, alpha_init=cfg.sac.alpha_init,
                       fixed_alpha=cfg.sac.fixed_alpha, target_entropy=target_entropy, action_spec=action_spec,
                       deactivate_vmap=DEACTIVATE_VMAP)
    elif cfg.algo == "td3":
        loss = TD3Loss(actor, critic, action_spec=action_spec, num_qvalue_nets=2, loss_function=fn,
                       deactivate_vmap=DEACTIVATE_VMAP)
        # target smoothing in units of each dimension's half range, as the TD3 paper (0.2 and 0.5 x max_action) and
        # as the exploration noise here; torchrl's policy_noise and noise_clip are absolute. TD3Loss scales and clamps
        # its noise with them as given, so per-dimension tensors work; as buffers they follow the loss to its device,
        # and non-persistent ones leave the checkpoint's keys as they were (they come from the config)
        half_range = (action_spec.space.high - action_spec.space.low) / 2
        for name, scale in (("policy_noise", cfg.td3.target_noise), ("noise_clip", cfg.td3.noise_clip)):
            delattr(loss, name)
            loss.register_buffer(name, scale * half_range, persistent=False)
    else:
        loss = DDPGLoss(actor, critic, loss_function=fn, delay_actor=True, delay_value=True)
    estimator = {"td0": ValueEstimators.TD0, "td1": ValueEstimators.TD1, "tdlambda": ValueEstimators.TDLambda}
    kwargs = {"lmbda": cfg.loss.lmbda} if cfg.loss.value_estimator == "tdlambda" else {}
    loss.make_value_estimator(estimator[cfg.loss.value_estimator], gamma=cfg.loss.gamma, **kwargs)
    return loss


# SACLoss / TD3Loss evaluate their two Q networks in a plain loop instead of vmap: a learner step took 20.6 against
# 23.2 ms (SAC) and 13.7 against 14.9 ms (TD3) here, one thread, batch 256 (benchmarks/offpolicy_update_cost.py
# deactivate_vmap=false|true measures it)
DEACTIVATE_VMAP = True


def make_target_updater(cfg: DictConfig, loss) -> TargetUpdate:
    """Soft (``target.tau``) or hard (a copy every ``target.hard_every`` updates) target networks."""
    hard_every = cfg.target.hard_every if cfg.target.mode == "hard" else None
    return TargetUpdate(loss, tau=cfg.target.tau, hard_every=hard_every)


def _adam(cfg: DictConfig, params, lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam over ``params``. Eager: fused, one kernel for all parameters (0.43 ms against 1.16 ms per step for SAC's
    critic here). Compiled: the plain (foreach) Adam, which torch.compile traces into the step (it will not trace
    into the fused kernel); under CUDA graphs with its step count on the device (``capturable``)."""
    if cfg.compile.enabled:
        return torch.optim.Adam(list(params), lr=lr, weight_decay=weight_decay, foreach=True,
                                capturable=cfg.compile.cudagraphs)
    return torch.optim.Adam(list(params), lr=lr, weight_decay=weight_decay, fused=True)


def _network_adam(cfg: DictConfig, params, network: str) -> torch.optim.Adam:
    """:func:`_adam` with the learning rate and weight decay of ``network`` ("actor" or "critic")."""
    prefix = "" if network == "actor" else "critic_"
    return _adam(cfg, params, cfg.optim[f"{prefix}lr"], cfg.optim[f"{prefix}weight_decay"])


def _actor_critic_groups(cfg: DictConfig, loss, critic_params, critic_key: str, actor_every: int = 1):
    """The actor and critic optimisers, each with its own learning rate, weight decay and gradient clip."""
    return [
        OptimGroup("actor", _network_adam(cfg, loss.actor_network_params.flatten_keys().values(), "actor"),
                   ("loss_actor",), cfg.optim.max_grad_norm, every=actor_every),
        OptimGroup("critic", _network_adam(cfg, critic_params.flatten_keys().values(), "critic"), (critic_key,),
                   cfg.optim.critic_max_grad_norm),
    ]


def _specs(env):
    obs_spec = env.observation_spec_unbatched["observation"]
    action_spec = env.action_spec_unbatched
    return obs_spec, action_spec


def _act(cfg):
    return ACTIVATIONS[cfg.model.activation]


def _hidden(cfg):
    return tuple(int(h) for h in cfg.model.hidden)


def _features(obs_spec) -> tuple[nn.Module, int]:
    """The observation's feature extractor and its width: a conv encoder for camera images (uint8 [C, H, W]),
    nothing for state vectors."""
    if obs_spec.dtype == torch.uint8:
        encoder = PixelEncoder(obs_spec.shape[-3], obs_spec.shape[-1])
        return encoder, encoder.out_features
    return nn.Identity(), obs_spec.shape[-1]


def _obs_net(cfg, obs_spec, out_features: int) -> nn.Module:
    """``observation -> out_features``: features (for images, a conv encoder) then the configured MLP."""
    features, width = _features(obs_spec)
    return nn.Sequential(features, mlp(width, out_features, _hidden(cfg), _act(cfg)))


class _QHead(nn.Module):
    """``Q(observation, action)``: the observation's features concatenated with the action into an MLP."""

    def __init__(self, cfg, obs_spec, action_dim: int):
        from torchrl.modules import MLP

        super().__init__()
        self.features, width = _features(obs_spec)
        # torchrl's MLP concatenates its inputs (features, action)
        self.head = MLP(in_features=width + action_dim, out_features=1, num_cells=list(_hidden(cfg)),
                        activation_class=_act(cfg))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(observation), action)


def _continuous_actor(cfg, obs_spec, action_spec) -> TensorDictSequential:
    """Deterministic actor ``observation -> action`` squashed into the action bounds (TD3, DDPG)."""
    from torchrl.modules import TanhModule

    return TensorDictSequential(
        TensorDictModule(_obs_net(cfg, obs_spec, action_spec.shape[-1]), in_keys=["observation"],
                         out_keys=["action_param"]),
        TanhModule(in_keys=["action_param"], out_keys=["action"], spec=action_spec),
    )


def _qvalue(cfg, obs_spec, action_dim: int):
    from torchrl.modules import ValueOperator

    return ValueOperator(_QHead(cfg, obs_spec, action_dim), in_keys=["observation", "action"])


def _noise(cfg_section, action_spec, anneal_env_steps: int):
    """Additive Gaussian or Ornstein-Uhlenbeck action noise; sigma is in units of half the action range."""
    from torchrl.modules import AdditiveGaussianModule, OrnsteinUhlenbeckProcessModule

    half_range = (action_spec.space.high - action_spec.space.low) / 2
    if cfg_section.noise == "gaussian":
        return AdditiveGaussianModule(action_spec, sigma_init=cfg_section.sigma, sigma_end=cfg_section.sigma_end,
                                      annealing_num_steps=anneal_env_steps, std=half_range, safe=True)
    if cfg_section.noise == "ou":
        # OU's own scale is absolute; eps anneals it from 1 to sigma_end / sigma. Needs the env's InitTracker.
        return OrnsteinUhlenbeckProcessModule(action_spec, sigma=float(cfg_section.sigma * half_range.mean()),
                                              eps_init=1.0, eps_end=cfg_section.sigma_end / cfg_section.sigma,
                                              annealing_num_steps=anneal_env_steps, safe=True)
    return None


def _noise_value(module) -> Callable[[], float]:
    """Current noise scale: Gaussian sigma, or the OU module's annealing factor eps."""
    if module is None:
        return lambda: 0.0
    return lambda: float(module.sigma if hasattr(module, "sigma") else module.eps)


def _q_network(cfg, obs_spec, n_actions: int) -> nn.Module:
    """DQN's ``observation -> Q values``: the Nature CNN on Atari frames (uint8 [C, H, W]) or the configured MLP;
    with ``dqn.dueling`` the last dense layer (Atari: 512 units) becomes a value and an advantage stream."""
    if obs_spec.dtype == torch.uint8:
        trunk = AtariTrunk(obs_spec.shape[-3], obs_spec.shape[-1], "nature", dense=not cfg.dqn.dueling,
                           channels_last=True)
        head = (DuelingHead(trunk.out_features, n_actions, 512) if cfg.dqn.dueling
                else nn.Linear(trunk.out_features, n_actions))
        return nn.Sequential(trunk, head)
    hidden = _hidden(cfg)
    if not cfg.dqn.dueling:
        return mlp(obs_spec.shape[-1], n_actions, hidden, _act(cfg))
    body = mlp(obs_spec.shape[-1], hidden[-2], hidden[:-2], _act(cfg)) if len(hidden) > 1 else nn.Identity()
    width = hidden[-2] if len(hidden) > 1 else obs_spec.shape[-1]
    activation = [_act(cfg)()] if len(hidden) > 1 else []
    return nn.Sequential(body, *activation, DuelingHead(width, n_actions, hidden[-1], _act(cfg)))


def _dqn(cfg, env) -> AlgoParts:
    from torchrl.modules import EGreedyModule, QValueActor

    obs_spec, action_spec = _specs(env)
    qnet = QValueActor(_q_network(cfg, obs_spec, action_spec.shape[-1]), in_keys=["observation"], spec=action_spec)
    greedy = EGreedyModule(action_spec, eps_init=cfg.dqn.eps_init, eps_end=cfg.dqn.eps_end,
                           annealing_num_steps=cfg.dqn.eps_anneal_env_steps)
    loss = make_loss(cfg, None, qnet, action_spec)
    optimizer = _network_adam(cfg, loss.value_network_params.flatten_keys().values(), "actor")
    return AlgoParts(
        collect_policy=TensorDictSequential(qnet, greedy), eval_policy=qnet, exploration=greedy, loss=loss,
        groups=[OptimGroup("q", optimizer, ("loss",), cfg.optim.max_grad_norm)],
        target_updater=make_target_updater(cfg, loss), exploration_value=lambda: float(greedy.eps), discrete=True,
    )


def _sac(cfg, env) -> AlgoParts:
    from torchrl.modules import ProbabilisticActor, TanhNormal

    obs_spec, action_spec = _specs(env)
    action_dim = action_spec.shape[-1]
    net = nn.Sequential(_obs_net(cfg, obs_spec, 2 * action_dim), NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=action_spec, distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=False,
    )
    loss = make_loss(cfg, actor, _qvalue(cfg, obs_spec, action_dim), action_spec)
    groups = _actor_critic_groups(cfg, loss, loss.qvalue_network_params, "loss_qvalue")
    if not cfg.sac.fixed_alpha:
        groups.append(OptimGroup("alpha", _adam(cfg, [loss.log_alpha], cfg.sac.alpha_lr),
                                 ("loss_alpha",)))
    return AlgoParts(
        collect_policy=actor, eval_policy=actor, exploration=None, loss=loss, groups=groups,
        target_updater=make_target_updater(cfg, loss), td_error_squared=False,
        exploration_value=lambda: float(loss.log_alpha.detach().exp()),
    )


def _ddpg(cfg, env) -> AlgoParts:
    obs_spec, action_spec = _specs(env)
    action_dim = action_spec.shape[-1]
    actor = _continuous_actor(cfg, obs_spec, action_spec)
    noise = _noise(cfg.ddpg, action_spec, cfg.ddpg.anneal_env_steps)
    loss = make_loss(cfg, actor, _qvalue(cfg, obs_spec, action_dim), action_spec)
    return AlgoParts(
        collect_policy=actor if noise is None else TensorDictSequential(actor, noise), eval_policy=actor,
        exploration=noise, loss=loss, groups=_actor_critic_groups(cfg, loss, loss.value_network_params, "loss_value"),
        target_updater=make_target_updater(cfg, loss), critic_loss_key="loss_value",
        exploration_value=_noise_value(noise),
    )


def _td3(cfg, env) -> AlgoParts:
    obs_spec, action_spec = _specs(env)
    action_dim = action_spec.shape[-1]
    actor = _continuous_actor(cfg, obs_spec, action_spec)
    noise = _noise(cfg.td3, action_spec, cfg.td3.anneal_env_steps)
    loss = make_loss(cfg, actor, _qvalue(cfg, obs_spec, action_dim), action_spec)
    groups = _actor_critic_groups(cfg, loss, loss.qvalue_network_params, "loss_qvalue",
                                  actor_every=cfg.td3.policy_delay)
    # Fujimoto et al. 2018: the actor and the targets move every policy_delay critic steps
    return AlgoParts(
        collect_policy=TensorDictSequential(actor, noise), eval_policy=actor, exploration=noise, loss=loss,
        groups=groups, target_updater=make_target_updater(cfg, loss), critic_only_method="value_loss",
        targets_follow="actor", exploration_value=_noise_value(noise),
    )
