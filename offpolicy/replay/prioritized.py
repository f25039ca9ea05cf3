"""Prioritized experience replay (Schaul et al. 2016) on this install: torchrl's own ``PrioritizedSampler`` and
``PrioritizedSliceSampler`` with their C++ sum/min segment trees replaced by a plain-torch array, because torchrl's
C++ extension (torchrl._torchrl) does not load against torch 2.13 here.

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(N), sampler=TorchPrioritizedSampler(N, alpha=0.7, beta=0.5))
    batch = rb.sample(256)             # batch["index"], batch["priority_weight"]
    loss = loss_module(batch)          # torchrl losses weight by "priority_weight" and write "td_error"
    rb.update_tensordict_priority(batch)

Everything else (priority transform, max-priority for new items, importance weights, slices) is torchrl's code. The
draws come from torch's RNG (the buffer's generator if it has one), never numpy's: the same ``torch.manual_seed``
samples the same indices, and a checkpoint's ``torch.get_rng_state()`` continues the stream on resume.
"""
from __future__ import annotations

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, PrioritizedSliceSampler

from shared import compat


class TorchSegmentTree:
    """The interface of torchrl's C++ ``SumSegmentTree``/``MinSegmentTree`` as a binary tree in one tensor.

    Leaves ``[size, 2 size)`` hold the slots, node ``i`` reduces its children ``2i`` and ``2i + 1``. Writes update
    the touched leaves' ancestors level by level, and ``scan_lower_bound`` descends from the root for the whole
    batch at once: O(batch log capacity) tensor ops, like the C++ tree (benchmarks/offpolicy_prioritized_replay.py).
    """

    def __init__(self, capacity: int, reduce: str, dtype: torch.dtype = torch.float32):
        self.capacity = capacity
        self.depth = max(capacity - 1, 1).bit_length()
        self.size = 1 << self.depth
        self.reduce = reduce
        self.neutral = 0.0 if reduce == "sum" else float("inf")
        # float64 nodes: sums over 1M slots keep the share of small priorities; reads return the sampler's dtype
        self.nodes = torch.full((2 * self.size,), self.neutral, dtype=torch.float64)
        self.dtype = dtype

    @property
    def values(self) -> torch.Tensor:
        """The slots (a view of the leaves)."""
        return self.nodes[self.size:self.size + self.capacity]

    def _combine(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b if self.reduce == "sum" else torch.minimum(a, b)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return float(self.nodes[self.size + int(index)])
        return self.nodes[self.size + torch.as_tensor(index, dtype=torch.long)].to(self.dtype).numpy()

    def __setitem__(self, index, value) -> None:
        node = torch.as_tensor(index, dtype=torch.long).reshape(-1) + self.size
        self.nodes[node] = torch.as_tensor(value, dtype=torch.float64).reshape(-1).expand(node.shape)
        for _ in range(self.depth):  # repeated ancestors are recomputed to the same value
            node = node >> 1
            self.nodes[node] = self._combine(self.nodes[node << 1], self.nodes[(node << 1) | 1])

    def set_all(self, values: torch.Tensor) -> None:
        """Overwrite every slot (checkpoint load) and rebuild the inner nodes."""
        self.nodes.fill_(self.neutral)
        self.values.copy_(values)
        for level in range(self.size.bit_length() - 2, -1, -1):
            lo, hi = 1 << level, 2 << level
            self.nodes[lo:hi] = self._combine(self.nodes[2 * lo:2 * hi:2], self.nodes[2 * lo + 1:2 * hi:2])

    def query(self, left: int, right: int) -> float:
        """Sum (or min) of the slots ``[left, right)``: the usual bottom-up walk over O(log capacity) nodes."""
        combine = (lambda a, b: a + b) if self.reduce == "sum" else min
        result = self.neutral
        lo, hi = int(left) + self.size, int(right) + self.size
        while lo < hi:
            if lo & 1:
                result = combine(result, self.nodes[lo].item())
                lo += 1
            if hi & 1:
                hi -= 1
                result = combine(result, self.nodes[hi].item())
            lo, hi = lo >> 1, hi >> 1
        return result

    def scan_lower_bound(self, mass) -> np.ndarray:
        """For each ``mass``, the first slot whose inclusive prefix sum exceeds it (zero-priority slots never win)."""
        mass = torch.as_tensor(mass, dtype=torch.float64).reshape(-1).clone()
        node = torch.ones(mass.shape, dtype=torch.long)
        for _ in range(self.depth):
            node = node << 1
            left = self.nodes[node]
            go_right = mass >= left
            mass -= left * go_right
            node += go_right
        return (node - self.size).clamp_max_(self.capacity - 1).numpy()


class _TorchTrees(compat.SamplerOnTorchRNG, compat.PrioritizedTreesHook):
    """Mixin: torchrl's sampler on :class:`TorchSegmentTree` s, drawing from torch's RNG (the hooks into torchrl's
    tree building and generator are in shared/compat.py)."""

    tree_class = TorchSegmentTree


class TorchPrioritizedSampler(_TorchTrees, PrioritizedSampler):
    """torchrl's ``PrioritizedSampler`` (same arguments and semantics) on :class:`TorchSegmentTree`."""


class TorchPrioritizedSliceSampler(_TorchTrees, PrioritizedSliceSampler):
    """torchrl's ``PrioritizedSliceSampler`` (prioritized sub-trajectories) on :class:`TorchSegmentTree`."""
