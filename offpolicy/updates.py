"""How one optimiser step updates the networks: the per-network optimisers (each with its own learning rate, weight
decay, gradient-norm clip and period) and the target networks (soft or hard, optionally only on the steps where the
actor was updated). Built from the config by algorithms.py; run by the torchrl trainer's loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import SoftUpdate
from torchrl.trainers.trainers import OptimizationStepper


@dataclass
class OptimGroup:
    """One network's optimiser: which loss terms it minimises, its gradient-norm clip and its period."""

    name: str
    optimizer: torch.optim.Optimizer
    loss_keys: tuple[str, ...]
    max_grad_norm: float | None = None
    every: int = 1  # step on every ``every``-th optimisation step (TD3's delayed actor: 2)

    def params(self):
        return [p for group in self.optimizer.param_groups for p in group["params"]]


class PerNetworkStepper(OptimizationStepper):
    """One optimisation step over several optimisers: forward the loss, backward the sum of the due optimisers' loss
    terms, then each due optimiser clips its own gradients to its own norm and steps.

    torchrl 0.14.1's trainers clip all parameters with one norm, and its TD3OptimizationStepper shares that norm between
    actor and critic; separate clips per optimiser need this stepper. The losses detach what each term must not train
    (SAC/TD3/DDPG), so one summed backward equals separate ones. On steps where only the critic is due,
    ``critic_only_method`` (TD3Loss.value_loss) skips the actor loss's forward. After each step the loss's TD error is
    written back as the replay priorities (when the buffer is prioritized).
    """

    updates_replay_priority = True

    def __init__(self, groups: list[OptimGroup], *, critic_only_method: str | None = None,
                 critic_loss_key: str = "loss_qvalue"):
        self.groups = groups
        self.critic_only_method = critic_only_method
        self.critic_loss_key = critic_loss_key
        self.steps = 0
        self.write_priorities = True  # the Ray engine's uniform replay actor has no priorities to write
        self.due: list[OptimGroup] = []
        # the same keys on every step, as the trainer averages them over a batch: the loss terms, each optimiser's
        # gradient norm and whatever else the loss reports on the first step (SAC's alpha and entropy); a value not
        # computed on this step (TD3's actor loss between actor updates) repeats its latest one
        self.latest = {k: torch.zeros(()) for g in groups for k in (*g.loss_keys, f"grad_norm_{g.name}")}
        self._keys_fixed = False

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state_dict: dict) -> None:
        self.steps = int(state_dict["steps"])

    def is_due(self, name: str) -> bool:
        """Whether optimiser ``name`` stepped on the latest optimisation step."""
        return any(g.name == name for g in self.due)

    def step(self, trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        self.steps += 1
        self.due = [g for g in self.groups if self.steps % g.every == 0]
        keys = {k for g in self.due for k in g.loss_keys}
        if self.critic_only_method is not None and keys == {self.critic_loss_key}:
            loss, metadata = trainer.compute_loss(sub_batch, method=self.critic_only_method)
            losses = TensorDict({self.critic_loss_key: loss})
            sub_batch.set("td_error", metadata["td_error"].detach().max(0)[0])
        else:
            losses = trainer.compute_loss(sub_batch)
        sum(losses[k] for k in sorted(keys)).backward()
        for group in self.due:
            max_norm = float("inf") if group.max_grad_norm is None else group.max_grad_norm
            losses[f"grad_norm_{group.name}"] = torch.nn.utils.clip_grad_norm_(group.params(), max_norm)  # pre-clip
            group.optimizer.step()
        for group in self.due:
            group.optimizer.zero_grad(set_to_none=True)
        replay = getattr(trainer, "replay_buffer", None)
        if (self.write_priorities and replay is not None and hasattr(replay, "update_tensordict_priority")
                and "td_error" in sub_batch.keys()):
            replay.update_tensordict_priority(sub_batch.reshape(-1))  # sliced batches are [n, slice_len]
        for key, value in losses.items():
            if key in self.latest or not self._keys_fixed:
                self.latest[key] = value.detach()
        self._keys_fixed = True
        return TensorDict(dict(self.latest))


class TargetUpdate(SoftUpdate):
    """Target networks after each optimisation step: soft (``target <- (1 - tau) target + tau online``) or hard (an
    exact copy on every ``hard_every``-th update), counted only on steps where ``when()`` holds (TD3: the steps that
    updated the actor, as in Fujimoto et al. 2018; torchrl's TD3Trainer updates them after every critic step).

    Replaces torchrl 0.14.1's HardUpdate, whose counter runs 0..K and so copies every K + 1 steps.
    """

    def __init__(self, loss_module, *, tau: float, hard_every: int | None = None,
                 when: Callable[[], bool] | None = None):
        super().__init__(loss_module, tau=tau)
        self.hard_every = hard_every
        self.when = when
        self.updates = 0  # updates counted so far (checkpointed, so hard copies keep their phase on resume)

    def step(self) -> None:
        if self.when is not None and not self.when():
            return
        self.updates += 1
        if self.hard_every is None or self.updates % self.hard_every == 0:
            super().step()

    def _step(self, p_source: torch.Tensor, p_target: torch.Tensor) -> None:
        if self.hard_every is None:
            super()._step(p_source, p_target)
        else:
            p_target.data.copy_(p_source.data)
