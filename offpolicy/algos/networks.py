"""Building blocks the algorithm modules share: networks over observations (MLP, or a conv encoder for camera
images), Q heads, the deterministic and tanh-Gaussian actors, action noise, Adam per network, the value estimator
and the target networks."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from omegaconf import DictConfig
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import BatchRenorm1d

from offpolicy.network_updates import OptimGroup, TargetUpdate
from shared.models import AtariTrunk, DuelingHead, PixelEncoder, ReLU, mlp
from shared.schema import key

ACTIVATIONS = {"relu": ReLU, "tanh": nn.Tanh, "elu": nn.ELU}
# torchrl warns when a loss with target parameters has no torchrl updater attached; ours is updates.TargetUpdate
warnings.filterwarnings("ignore", message="No target network updater has been associated")


# the doc of ``random_prefill``, declared by NoiseConfig (false) and by TD3 (true)
RANDOM_PREFILL_DOC = ("the prefill's actions (collector.prefill_env_steps, before the first optimiser step) drawn "
                      "uniformly in the action bounds, as the TD3 authors' start_timesteps; false: the noisy actor's")


@dataclass
class NoiseConfig:
    """The keys of an exploration-noise section (TD3, DDPG)."""

    noise: str = key("gaussian", "gaussian or ou (Ornstein-Uhlenbeck)", choices=("gaussian", "ou"))
    sigma: float = key(0.1, "exploration noise std, in units of half the action range", min=1e-9)
    sigma_end: float = key(0.1, "annealed linearly to this...", min=0)
    anneal_env_steps: int = key(1000000, "...over this many collected env steps", min=1, integer=True)
    random_prefill: bool = key(False, RANDOM_PREFILL_DOC)


@dataclass
class EpsilonGreedyConfig:
    """The epsilon-greedy keys of a value-based section (DQN, and any Q-learning variant)."""

    eps_init: float = key(1.0, "epsilon-greedy: starts fully random...", min=0, max=1)
    eps_end: float = key(0.04, "...and anneals linearly to this", min=0, max=1)
    eps_anneal_env_steps: int = key(8000, "over this many collected env steps (the module is stepped after every "
                                          "batch)", min=1, integer=True)


@dataclass
class TemperatureConfig:
    """The entropy-temperature keys of a SAC-family section (SAC, CrossQ, REDQ)."""

    alpha_init: float = key(1.0, "initial entropy temperature", min=1e-9)
    target_entropy: float | str = key("auto", "auto (= -action_dim) or a number")
    fixed_alpha: bool = key(False, "true keeps alpha at alpha_init")
    alpha_lr: float = key(0.001, "temperature learning rate", min=1e-12)

# SACLoss / TD3Loss evaluate their two Q networks in a plain loop instead of vmap: the learner step is faster that way
# for SAC and TD3 at batch 256 (benchmarks/offpolicy_update_cost.py deactivate_vmap=false|true measures it)
DEACTIVATE_VMAP = True


def specs(env):
    """The observation spec and the action spec (unbatched)."""
    return env.observation_spec_unbatched["observation"], env.action_spec_unbatched


# Each builder below takes the config sections it reads (``model``, ``optim``, ``compile``, ``loss``, ``target`` or an
# algorithm's own), not the whole config: what a part depends on is in its signature.


def activation(model: DictConfig) -> type[nn.Module]:
    return ACTIVATIONS[model.activation]


def hidden(model: DictConfig) -> tuple[int, ...]:
    return tuple(int(h) for h in model.hidden)


def features(obs_spec) -> tuple[nn.Module, int]:
    """The observation's feature extractor and its width: a conv encoder for camera images (uint8 [C, H, W]),
    nothing for state vectors."""
    if obs_spec.dtype == torch.uint8:
        encoder = PixelEncoder(obs_spec.shape[-3], obs_spec.shape[-1])
        return encoder, encoder.out_features
    return nn.Identity(), obs_spec.shape[-1]


def obs_net(model: DictConfig, obs_spec, out_features: int) -> nn.Module:
    """``observation -> out_features``: features (for images, a conv encoder) then the configured MLP."""
    extractor, width = features(obs_spec)
    return nn.Sequential(extractor, mlp(width, out_features, hidden(model), activation(model)))


class ClampedBatchRenorm1d(BatchRenorm1d):
    """torchrl's ``BatchRenorm1d`` whose warm-up ends: the renormalisation factor goes 0 -> 1 over ``warmup_steps``
    training calls and stays 1. Why: torchrl 0.14.1 (torchrl/modules/models/batchrenorm.py line 114) writes
    ``self.num_batches_tracked.clamp_max(self.warmup_steps)`` and discards the result, so the counter grows without
    bound and the factor ``num_batches_tracked // warmup_steps`` with it: past twice the warm-up the r and d
    corrections are doubled, tripled, ... Clamping in place before the forward (also a counter restored from a
    checkpoint of the unclamped class) keeps the factor at most 1, and stays correct if torchrl clamps too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.num_batches_tracked.clamp_max_(self.warmup_steps)
        return super().forward(x)


def running_statistics(module: nn.Module) -> list[torch.Tensor]:
    """The running means and variances of ``module``'s normalisation layers (a torchrl loss keeps its networks'
    buffers beside their parameters), which each forward in training mode moves with its own batch: what learner
    ranks average besides the gradients."""
    return [b for name, b in module.named_buffers() if name.endswith(("running_mean", "running_var"))]


class QHead(nn.Module):
    """``Q(observation, action)``: the observation's features concatenated with the action into an MLP. With
    ``norm`` (a constructor of a normalisation layer of a given width, e.g. CrossQ's batch renormalisation), the
    concatenated input and every hidden layer are normalised, as CrossQ's reference critic (SBX) does."""

    def __init__(self, model: DictConfig, obs_spec, action_dim: int, norm=None):
        from torchrl.modules import MLP

        super().__init__()
        self.features, width = features(obs_spec)
        cells = list(hidden(model))
        self.input_norm = norm(width + action_dim) if norm is not None else nn.Identity()
        self.head = MLP(in_features=width + action_dim, out_features=1, num_cells=cells,
                        activation_class=activation(model), norm_class=norm,
                        norm_kwargs=None if norm is None else [{"num_features": n} for n in cells])

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.head(self.input_norm(torch.cat([self.features(observation), action], -1)))


def qvalue(model: DictConfig, obs_spec, action_dim: int, norm=None):
    """``(observation, action) -> state_action_value``."""
    from torchrl.modules import ValueOperator

    return ValueOperator(QHead(model, obs_spec, action_dim, norm), in_keys=["observation", "action"])


def continuous_actor(model: DictConfig, obs_spec, action_spec) -> TensorDictSequential:
    """Deterministic actor ``observation -> action`` squashed into the action bounds (TD3, DDPG)."""
    from torchrl.modules import TanhModule

    return TensorDictSequential(
        TensorDictModule(obs_net(model, obs_spec, action_spec.shape[-1]), in_keys=["observation"],
                         out_keys=["action_param"]),
        TanhModule(in_keys=["action_param"], out_keys=["action"], spec=action_spec),
    )


def tanh_normal_actor(model: DictConfig, obs_spec, action_spec):
    """Stochastic actor ``observation -> TanhNormal`` within the action bounds (SAC, CrossQ, REDQ); its
    deterministic mode is the evaluation policy."""
    from torchrl.modules import TanhNormal

    from offpolicy.algos.policies import TanhNormalActor

    net = nn.Sequential(obs_net(model, obs_spec, 2 * action_spec.shape[-1]), NormalParamExtractor())
    return TanhNormalActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], spec=action_spec, distribution_class=TanhNormal,
        distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
        return_log_prob=False,
    )


def noise(section: DictConfig, action_spec, anneal_env_steps: int, prefill_env_steps: int):
    """Additive Gaussian or Ornstein-Uhlenbeck action noise; sigma is in units of half the action range. Its buffer
    ``random_env_steps_left`` counts the env steps still to act uniformly at random (the prefill's, with
    ``random_prefill``; :class:`~offpolicy.algos.policies.NoisyActor` reads it, :func:`~offpolicy.algos.base.anneal`
    counts it down): a buffer, so it travels to the collectors with the published weights and resumes with the
    exploration state."""
    from torchrl.modules import AdditiveGaussianModule, OrnsteinUhlenbeckProcessModule

    half_range = (action_spec.space.high - action_spec.space.low) / 2
    if section.noise == "gaussian":
        module = AdditiveGaussianModule(action_spec, sigma_init=section.sigma, sigma_end=section.sigma_end,
                                        annealing_num_steps=anneal_env_steps, std=half_range, safe=True)
    elif section.noise == "ou":
        # OU's own scale is absolute; eps anneals it from 1 to sigma_end / sigma. Needs the env's InitTracker.
        module = OrnsteinUhlenbeckProcessModule(action_spec, sigma=float(section.sigma * half_range.mean()),
                                                eps_init=1.0, eps_end=section.sigma_end / section.sigma,
                                                annealing_num_steps=anneal_env_steps, safe=True)
    else:
        return None
    module.register_buffer("random_env_steps_left",
                           torch.tensor(prefill_env_steps if section.random_prefill else 0, dtype=torch.int64))
    return module


def noise_value(module) -> Callable[[], float]:
    """Current noise scale: Gaussian sigma, or the OU module's annealing factor eps."""
    if module is None:
        return lambda: 0.0
    return lambda: float(module.sigma if hasattr(module, "sigma") else module.eps)


def adam(compile_opts: DictConfig, params, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.999)
         ) -> torch.optim.Adam:
    """Adam over ``params``: fused, one kernel for all parameters (a fraction of the per-parameter loop's time for
    SAC's critic), also when the loss is compiled (the optimiser step stays eager, offpolicy/learner.py); under CUDA graphs with
    its step count on the device (``capturable``)."""
    return torch.optim.Adam(list(params), lr=lr, weight_decay=weight_decay, betas=betas, fused=True,
                            capturable=compile_opts.cudagraphs)


def network_adam(optim: DictConfig, compile_opts: DictConfig, params, network: str, betas=(0.9, 0.999)
                 ) -> torch.optim.Adam:
    """:func:`adam` with the learning rate and weight decay of ``network`` ("actor" or "critic")."""
    prefix = "" if network == "actor" else "critic_"
    return adam(compile_opts, params, optim[f"{prefix}lr"], optim[f"{prefix}weight_decay"], betas)


def actor_critic_groups(optim: DictConfig, compile_opts: DictConfig, loss, critic_params, critic_key: str,
                        actor_every: int = 1, betas=(0.9, 0.999), targets_follow_actor: bool = False
                        ) -> list[OptimGroup]:
    """The actor and critic optimisers, each with its own learning rate, weight decay and gradient clip; with
    ``targets_follow_actor`` the target networks move only on the actor's steps (TD3)."""
    actor_params, critic_params = (p.flatten_keys().values() for p in (loss.actor_network_params, critic_params))
    return [
        OptimGroup("actor", network_adam(optim, compile_opts, actor_params, "actor", betas), ("loss_actor",),
                   optim.max_grad_norm, every=actor_every),
        OptimGroup("critic", network_adam(optim, compile_opts, critic_params, "critic", betas), (critic_key,),
                   optim.critic_max_grad_norm, moves_targets=not targets_follow_actor),
    ]


def alpha_group(compile_opts: DictConfig, loss, section: DictConfig, every: int = 1) -> list[OptimGroup]:
    """The entropy temperature's optimiser (none with ``fixed_alpha``)."""
    if section.fixed_alpha:
        return []
    optimizer = adam(compile_opts, [loss.log_alpha], section.alpha_lr)
    return [OptimGroup("alpha", optimizer, ("loss_alpha",), every=every)]


def alpha_value(loss) -> Callable[[], float]:
    """The entropy temperature alpha of a SAC-family loss, for the ``train/exploration`` metric."""
    return lambda: float(loss.log_alpha.detach().exp())


def target_entropy(section: DictConfig):
    return "auto" if section.target_entropy == "auto" else float(section.target_entropy)


def with_value_estimator(section: DictConfig, loss):
    """``loss`` with its value estimator (TD(0), TD(1) or TD(lambda)): the one place where the ``loss`` section's
    estimator keys are read."""
    from torchrl.objectives import ValueEstimators

    estimator = {"td0": ValueEstimators.TD0, "td1": ValueEstimators.TD1, "tdlambda": ValueEstimators.TDLambda}
    kwargs = {"lmbda": section.lmbda} if section.value_estimator == "tdlambda" else {}
    loss.make_value_estimator(estimator[section.value_estimator], gamma=section.gamma, **kwargs)
    return loss


def target_updater(target: DictConfig, loss) -> TargetUpdate:
    """Soft (``target.tau``) or hard (a copy every ``target.hard_every`` updates) target networks."""
    hard_every = target.hard_every if target.mode == "hard" else None
    return TargetUpdate(loss, tau=target.tau, hard_every=hard_every)


def critic_only(loss_method, ensemble_td_error: bool) -> Callable:
    """A :attr:`AlgoParts.critic_only` hook from a torchrl loss's critic-loss method (``(value, metadata)``);
    ``ensemble_td_error``: its TD error is per Q network ``[Q, B]`` and the priority takes the largest."""
    def run(sample):
        value, metadata = loss_method(sample)
        td_error = metadata["td_error"].detach()
        return value, td_error.max(0)[0] if ensemble_td_error else td_error
    return run


def q_network(model, obs_spec, n_actions: int, dueling: bool, precision: str = "float32") -> nn.Module:
    """``observation -> Q values``: the Nature CNN on Atari frames (uint8 [C, H, W]) or the MLP of the ``model``
    section; ``dueling``: the last dense layer (Atari: 512 units) becomes a value and an advantage stream.
    ``precision`` (float32 | bfloat16): the CNN's compute precision; its head stays float32."""
    if obs_spec.dtype == torch.uint8:
        # channels-last pays in float32 only: under bf16 it made the update slower (benchmarks/atari_dqn_update_cost.py)
        trunk = AtariTrunk(obs_spec.shape[-3], obs_spec.shape[-1], "nature", dense=not dueling,
                           channels_last=precision == "float32", precision=precision)
        head = DuelingHead(trunk.out_features, n_actions, 512) if dueling else nn.Linear(trunk.out_features, n_actions)
        return nn.Sequential(trunk, head)
    sizes, act = hidden(model), activation(model)
    if not dueling:
        return mlp(obs_spec.shape[-1], n_actions, sizes, act)
    body = mlp(obs_spec.shape[-1], sizes[-2], sizes[:-2], act) if len(sizes) > 1 else nn.Identity()
    width = sizes[-2] if len(sizes) > 1 else obs_spec.shape[-1]
    between = [act()] if len(sizes) > 1 else []
    return nn.Sequential(body, *between, DuelingHead(width, n_actions, sizes[-1], act))
