"""The learner: optimiser steps on replayed batches. One object does the same work in the training process
(``engine=local``) and in every Ray learner rank (``engine=ray``, where ``grad_sync`` averages the gradients over the
ranks with ``torch.distributed``).

One step: sample, check the sample (shape, keys, no transition from a policy newer than the learner's), forward the
torchrl loss, one backward of the due optimisers' terms, each due optimiser clips its own gradients to its own norm
and steps, the target networks move, and the TD error is written back as the replay priority (prioritized replay).
"""
from __future__ import annotations

from collections import defaultdict

import torch
from tensordict import TensorDictBase

from offpolicy.invariants import InvariantError, check_sample_batch
from offpolicy.metrics import action_stats
from offpolicy.updates import OptimGroup, TargetUpdate

# Uniform samples of a round are drawn this many batches per replay call and split: the same i.i.d. draws as one
# call per batch (replay does not change during a round's updates), minus most of the per-call cost (~0.6 ms in
# process, ~10 ms from a Ray rank to the replay actor).
SAMPLE_CHUNK = 32


def abs_td_error(td_error: torch.Tensor, *, squared: bool) -> torch.Tensor:
    """``|delta|`` from what a torchrl loss wrote as ``"td_error"`` (``delta^2`` when ``squared``)."""
    return td_error.sqrt() if squared else td_error.abs()


class Learner:
    """Runs optimiser steps of one algorithm's torchrl loss over its :class:`OptimGroup` optimisers.

    ``critic_only_method`` (TD3Loss.value_loss) is called on steps where only the critic is due, skipping the actor
    loss's forward; with ``targets_follow`` the target networks move only on steps where that optimiser stepped. The
    losses detach what each term must not train, so one summed backward equals separate ones.
    """

    def __init__(self, loss, groups: list[OptimGroup], target_updater: TargetUpdate, *,
                 sample_shape: tuple[int, ...], critic_only_method: str | None = None,
                 critic_loss_key: str = "loss_qvalue", targets_follow: str | None = None,
                 prioritized: bool = False, td_error_squared: bool = True,
                 chunk: int = SAMPLE_CHUNK, check_every: int = 1, device: torch.device | None = None,
                 action_bounds: tuple[torch.Tensor, torch.Tensor] | None = None, grad_sync=None):
        self.loss = loss
        self.groups = groups
        self.target_updater = target_updater
        self.sample_shape = tuple(sample_shape)
        self.critic_only_method = critic_only_method
        self.critic_loss_key = critic_loss_key
        self.targets_follow = targets_follow
        self.prioritized, self.td_error_squared = prioritized, td_error_squared
        self.chunk = chunk  # batches per replay call (1 for prioritized and sliced replay)
        self.device = device  # where the loss lives (a GPU learner rank); replay stays on the CPU
        self.check_every = check_every
        self.action_bounds = action_bounds
        self.grad_sync = grad_sync
        self.steps = 0  # optimiser steps so far (checkpointed: TD3's actor keeps its phase on resume)
        self.due: list[OptimGroup] = []
        # values not computed on a step (TD3's actor loss between actor updates) repeat their latest one
        self._latest: dict[str, torch.Tensor] = {}
        target_updater.init_()

    # --- one round ---------------------------------------------------------------------------------------------
    def update(self, replay, n_steps: int, version: int) -> dict[str, float]:
        """``n_steps`` optimiser steps on batches from ``replay``; ``version`` is the newest policy version a sampled
        transition may carry. Returns ``loss/`` means over the round and ``replay/`` statistics of its last sample."""
        if n_steps == 0:
            return {}
        sums: dict[str, list[torch.Tensor]] = defaultdict(list)
        sample = None
        for sample in self._samples(replay, n_steps):
            for key, value in self.step(sample, version).items():
                sums[key].append(value)
            if self.targets_follow is None or self.is_due(self.targets_follow):
                self.target_updater.step()
            if self.prioritized:
                self.write_priorities(replay, sample)
        out = {f"loss/{k}": float(torch.stack(v).mean()) for k, v in sums.items()}
        low, high = self.action_bounds if self.action_bounds is not None else (None, None)
        out.update({f"replay/{k}": v for k, v in action_stats(sample["action"].cpu(), low, high).items()})
        out["replay/reward"] = float(sample["next", "reward"].float().mean())
        return out

    def _samples(self, replay, n_steps: int):
        batch = self.sample_shape[0] * (self.sample_shape[1] if len(self.sample_shape) > 1 else 1)
        done = 0
        while done < n_steps:
            k = min(self.chunk, n_steps - done)
            drawn = replay.sample(batch * k)
            if self.device is not None:
                drawn = drawn.to(self.device, non_blocking=True)
            for sample in (drawn.split(batch) if k > 1 else (drawn,)):
                yield sample.reshape(self.sample_shape) if len(self.sample_shape) > 1 else sample
            done += k

    def write_priorities(self, replay, sample: TensorDictBase) -> None:
        """Give the sampled transitions the priority ``|delta|`` (the sampler makes it ``(|delta| + eps)^alpha``,
        Schaul et al. 2016), the same for every algorithm: torchrl's DQN, DDPG and TD3 losses write ``delta^2``."""
        sample.set("td_error", abs_td_error(sample.get("td_error"), squared=self.td_error_squared))
        replay.update_tensordict_priority(sample.reshape(-1))  # sliced batches are [n, slice_len]

    def check(self, sample: TensorDictBase, version: int) -> None:
        """The sampled-batch invariants: configured shape, the keys the losses read, no transition from a newer
        policy than ``version``."""
        check_sample_batch(sample, shape=self.sample_shape)
        newest = sample.get(("next", "policy_version"), None)
        if newest is not None and int(newest.max()) > version:
            raise InvariantError(f"sampled a transition of policy_version {int(newest.max())} on a learner at "
                                 f"version {version}")

    # --- one step ----------------------------------------------------------------------------------------------
    def step(self, sample: TensorDictBase, version: int | None = None) -> dict[str, torch.Tensor]:
        """One optimiser step on ``sample``; returns the detached scalar loss terms and pre-clip gradient norms."""
        self.steps += 1
        if version is not None and self.steps % self.check_every == 0:
            self.check(sample, version)
        self.due = [g for g in self.groups if self.steps % g.every == 0]
        keys = sorted({k for g in self.due for k in g.loss_keys})
        if self.critic_only_method is not None and keys == [self.critic_loss_key]:
            value, metadata = getattr(self.loss, self.critic_only_method)(sample)
            losses = {self.critic_loss_key: value}
            sample.set("td_error", metadata["td_error"].detach().max(0)[0])
        else:
            losses = dict(self.loss(sample).items())
        sum(losses[k] for k in keys).backward()
        for group in self.due:
            params = group.params()
            if self.grad_sync is not None:
                self.grad_sync(params)
            max_norm = float("inf") if group.max_grad_norm is None else group.max_grad_norm
            losses[f"grad_norm_{group.name}"] = torch.nn.utils.clip_grad_norm_(params, max_norm)  # pre-clip norm
            group.optimizer.step()
            group.optimizer.zero_grad(set_to_none=True)
        for key, value in losses.items():
            if value.numel() == 1:  # DDPGLoss also returns per-sample diagnostics
                self._latest[key] = value.detach()
        return self._latest

    def is_due(self, name: str) -> bool:
        """Whether optimiser ``name`` stepped on the latest optimiser step (TD3's targets move with its actor)."""
        return any(g.name == name for g in self.due)

    # --- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Networks (with targets and SAC's temperature), optimisers, step and target-update counters."""
        return {"loss": self.loss.state_dict(),
                "optimizers": {g.name: g.optimizer.state_dict() for g in self.groups},
                "steps": self.steps, "target_updates": self.target_updater.updates}

    def load_state_dict(self, state: dict) -> None:
        self.loss.load_state_dict(state["loss"])
        for group in self.groups:
            group.optimizer.load_state_dict(state["optimizers"][group.name])
        self.steps = int(state["steps"])
        self.target_updater.updates = int(state["target_updates"])
