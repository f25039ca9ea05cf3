"""The A3C update on a worker: torchrl GAE + A2C loss on the local model, applied to the shared global model."""
from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.objectives import A2CLoss
from torchrl.objectives.value import GAE

from a3c.optim import copy_gradients
from shared.models import AtariActorCritic, RecurrentState, to_channels_last, torchrl_actor_critic


class A3CLearner:
    """One worker's learner: ``update(batch)`` computes advantages, the loss and gradients on ``local`` and steps
    the shared ``optimizer`` of ``global_model`` with a copy of those gradients."""

    def __init__(self, local: AtariActorCritic, global_model: AtariActorCritic, optimizer: torch.optim.Optimizer,
                 *, gamma: float, gae_lambda: float, entropy_coeff: float, critic_coeff: float,
                 loss_critic_type: str, max_grad_norm: float, rollout_size: int, minibatches: int = 1):
        self.local = local
        self.global_model = global_model
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.minibatches = minibatches
        actor, critic = torchrl_actor_critic(local)
        # values come from the acting passes (see Rollout.collect), so GAE runs without a value network
        self.gae = GAE(gamma=gamma, lmbda=gae_lambda, value_network=None, average_gae=False)
        self.loss = A2CLoss(actor, critic, entropy_coeff=entropy_coeff, critic_coeff=critic_coeff,
                            loss_critic_type=loss_critic_type, functional=False)
        self.shuffler = None
        if minibatches > 1:
            self.shuffler = ReplayBuffer(storage=LazyTensorStorage(rollout_size), sampler=SamplerWithoutReplacement(),
                                         batch_size=rollout_size // minibatches)

    @classmethod
    def from_config(cls, cfg, local: AtariActorCritic, global_model: AtariActorCritic,
                    optimizer: torch.optim.Optimizer) -> "A3CLearner":
        """The learner of a run's config (its ``a3c`` section, the rollout size of ``env.envs_per_worker`` games x
        ``a3c.t_max`` steps)."""
        a3c = cfg.a3c
        return cls(local, global_model, optimizer, gamma=a3c.gamma, gae_lambda=a3c.gae_lambda,
                   entropy_coeff=a3c.entropy_coeff, critic_coeff=a3c.critic_coeff,
                   loss_critic_type=a3c.loss_critic_type, max_grad_norm=a3c.max_grad_norm,
                   rollout_size=cfg.env.envs_per_worker * a3c.t_max, minibatches=a3c.minibatches)

    def sync(self) -> None:
        """Load the global weights into the local model."""
        self.local.load_state_dict(self.global_model.state_dict())

    def update(self, rollout: TensorDict, start_state: RecurrentState | None = None) -> dict[str, float]:
        """Apply one rollout (``[envs, t_max]``): one optimizer step, or one per shuffled minibatch (feed-forward
        only). A recurrent model is unrolled over the rollout from ``start_state`` (truncated backprop through it)."""
        self.gae(rollout)
        # where the env forced FIRE after a lost life, the policy's sample never ran and changed nothing: its
        # log-prob term would be off-policy noise, so only the value (its target is what happened) and entropy stay
        rollout["advantage"] = rollout["advantage"].masked_fill(rollout["fire_forced"], 0.0)
        if self.local.recurrent:
            frames = rollout["observation"]
            flat = to_channels_last(frames.reshape(-1, *frames.shape[2:]))
            rollout["hidden"] = self.local.features(flat.view(frames.shape), start_state, rollout["is_init"][..., 0])
            return self._step(rollout.reshape(-1))
        data = rollout.reshape(-1)
        if self.shuffler is None:
            return self._step(data)
        self.shuffler.empty()
        self.shuffler.extend(data)
        metrics = {}
        for i in range(self.minibatches):
            if i:
                self.sync()
            metrics = self._step(self.shuffler.sample())
        return metrics

    def _step(self, batch: TensorDict) -> dict[str, float]:
        if "hidden" not in batch.keys():  # feed-forward: the shared features once, with grad, for both heads
            batch["hidden"] = self.local.features(to_channels_last(batch["observation"]))
        losses = self.loss(batch)
        # A2CLoss leaves out loss_entropy (and the entropy) when entropy_coeff is 0
        total = sum(v for k, v in losses.items() if k.startswith("loss_"))
        total.backward()
        copy_gradients(self.local, self.global_model)
        grad_norm = nn.utils.clip_grad_norm_(self.global_model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.local.zero_grad(set_to_none=True)
        names = {"loss_objective": "loss/objective", "loss_critic": "loss/critic", "loss_entropy": "loss/entropy",
                 "entropy": "a3c/entropy"}
        metrics = {name: losses[key].item() for key, name in names.items() if key in losses.keys()}
        return {**metrics, "a3c/grad_norm": grad_norm.item(), "a3c/advantage": batch["advantage"].mean().item()}
