"""How one optimiser step updates the networks: the per-network optimisers (each with its own learning rate, weight
decay, gradient-norm clip and period) and the target networks (soft or an exact hard copy). Built from the config by
the algorithm modules (offpolicy/algos/); run by the learner (learner.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TARGETED_NETWORKS = ("actor_network", "value_network", "qvalue_network")


@dataclass
class OptimGroup:
    """One network's optimiser: which loss terms it minimises, its gradient-norm clip and its period."""

    name: str
    optimizer: torch.optim.Optimizer
    loss_keys: tuple[str, ...]
    max_grad_norm: float | None = None
    every: int = 1  # step on every ``every``-th optimiser step (TD3's delayed actor: 2)
    moves_targets: bool = True  # the target networks move on the steps where this group steps (TD3: actor only)

    def params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]


class TargetUpdate:
    """Target networks of a torchrl loss, after an optimiser step: soft (``target <- (1 - tau) target + tau online``)
    or hard (an exact copy on every ``hard_every``-th update).

    torchrl 0.14.1's ``SoftUpdate`` rebuilds its source/target TensorDicts on every step (Python work on each update)
    and its ``HardUpdate`` copies every K + 1 steps; this pairs the loss's public ``<net>_params`` with its
    ``target_<net>_params`` once and updates the tensors in place.
    """

    def __init__(self, loss_module, *, tau: float, hard_every: int | None = None):
        self.loss_module = loss_module
        self.tau = tau
        self.hard_every = hard_every
        self.updates = 0  # updates counted so far (checkpointed, so hard copies keep their phase on resume)
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    @torch.no_grad()
    def init_(self) -> None:
        """Pair the online and target tensors (after the loss has moved to its device) and make the targets exact
        copies of the online networks."""
        self.pairs = []
        for name in TARGETED_NETWORKS:
            target = getattr(self.loss_module, f"target_{name}_params", None)
            if target is None:
                continue
            source = getattr(self.loss_module, f"{name}_params").flatten_keys()
            target = target.flatten_keys()
            # a loss that does not delay a network (REDQ's actor) lists the network itself as its target: skip it
            self.pairs += [(source[k].data, target[k].data) for k in source.keys()
                           if source[k].data_ptr() != target[k].data_ptr()]
        if not self.pairs:
            raise ValueError(f"{type(self.loss_module).__name__} has no target networks")
        for source, target in self.pairs:
            target.copy_(source)

    @property
    def soft(self) -> bool:
        return self.hard_every is None

    def tick(self) -> bool:
        """Count one update; True when the targets move on it (soft: every update; hard: every ``hard_every``-th).
        The learner's compiled step moves soft targets itself (:meth:`move_` is pure tensor work)."""
        self.updates += 1
        return self.soft or self.updates % self.hard_every == 0

    @torch.no_grad()
    def move_(self) -> None:
        """Move the targets: ``lerp`` towards the online networks by ``tau`` (soft) or copy them (hard)."""
        for source, target in self.pairs:
            if self.soft:
                target.lerp_(source, self.tau)
            else:
                target.copy_(source)

    def step(self) -> None:
        """Count one update and move the targets when it is due."""
        if self.tick():
            self.move_()
