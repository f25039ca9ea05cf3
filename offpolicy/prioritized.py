"""Prioritized experience replay (Schaul et al. 2016) on this install: torchrl's own ``PrioritizedSampler`` and
``PrioritizedSliceSampler`` with their C++ sum/min segment trees replaced by a plain-torch array, because torchrl's
C++ extension (torchrl._torchrl) does not load against torch 2.13 here.

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(N), sampler=TorchPrioritizedSampler(N, alpha=0.7, beta=0.5))
    batch = rb.sample(256)             # batch["index"], batch["priority_weight"]
    loss = loss_module(batch)          # torchrl losses weight by "priority_weight" and write "td_error"
    rb.update_tensordict_priority(batch)

Everything else (priority transform, max-priority for new items, importance weights, slices) is torchrl's code.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler, PrioritizedSliceSampler


class TorchSegmentTree:
    """The interface of torchrl's C++ ``SumSegmentTree``/``MinSegmentTree`` over one tensor.

    Point reads and writes are O(1); ``query`` and ``scan_lower_bound`` are O(capacity) tensor ops (a sum/min or a
    cumsum + searchsorted), which at 1M slots cost a few ms per sample (benchmarks/offpolicy_prioritized_replay.py).
    Sums run in float64 so that they keep the share of small priorities at 1M slots.
    """

    def __init__(self, capacity: int, reduce: str, dtype: torch.dtype = torch.float32):
        self.values = torch.full((capacity,), 0.0 if reduce == "sum" else float("inf"), dtype=dtype)
        self.reduce = reduce

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return float(self.values[int(index)])
        return self.values[torch.as_tensor(index, dtype=torch.long)].numpy()

    def __setitem__(self, index, value) -> None:
        if isinstance(index, (int, np.integer)):
            self.values[int(index)] = float(value)
        else:
            self.values[torch.as_tensor(index, dtype=torch.long)] = torch.as_tensor(value, dtype=self.values.dtype)

    def query(self, left: int, right: int) -> float:
        """Sum (or min) of the slots ``[left, right)``."""
        part = self.values[int(left):int(right)]
        return float(part.sum(dtype=torch.float64) if self.reduce == "sum" else part.min())

    def scan_lower_bound(self, mass) -> np.ndarray:
        """For each ``mass``, the first slot whose inclusive prefix sum exceeds it (zero-priority slots never win)."""
        cumsum = self.values.cumsum(0, dtype=torch.float64)
        index = torch.searchsorted(cumsum, torch.as_tensor(mass, dtype=torch.float64), right=True)
        return index.clamp_max_(len(self.values) - 1).numpy()


class _TorchTrees:
    """Mixin: build and checkpoint :class:`TorchSegmentTree` s where torchrl builds and pickles its C++ trees."""

    def _init(self) -> None:
        self._sum_tree = TorchSegmentTree(self._max_capacity, "sum", self.dtype)
        self._min_tree = TorchSegmentTree(self._max_capacity, "min", self.dtype)

    def state_dict(self) -> dict[str, Any]:
        # tensors instead of tree objects, so checkpoints load with torch.load(weights_only=True)
        state = super().state_dict()
        state["_sum_tree"] = self._sum_tree.values.clone()
        state["_min_tree"] = self._min_tree.values.clone()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        trees = {k: state_dict[k] for k in ("_sum_tree", "_min_tree")}
        super().load_state_dict({**state_dict, "_sum_tree": None, "_min_tree": None})
        self._init()
        self._sum_tree.values.copy_(trees["_sum_tree"])
        self._min_tree.values.copy_(trees["_min_tree"])


class TorchPrioritizedSampler(_TorchTrees, PrioritizedSampler):
    """torchrl's ``PrioritizedSampler`` (same arguments and semantics) on :class:`TorchSegmentTree`."""


class TorchPrioritizedSliceSampler(_TorchTrees, PrioritizedSliceSampler):
    """torchrl's ``PrioritizedSliceSampler`` (prioritized sub-trajectories) on :class:`TorchSegmentTree`."""
