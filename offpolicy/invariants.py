"""Invariants checked while training. A broken one raises :class:`InvariantError`, which stops the run (train.py
saves a checkpoint and prints one ``error:`` line).

Documented relation between weights and optimiser steps: weights are published to the collector after every
collected batch, so the transitions of batch ``k`` (0-based, counted from the start of the run) carry
``policy_version == k``, and the optimiser step count grows by exactly ``optim_steps_per_batch`` per batch once the
replay buffer holds ``prefill_frames`` transitions (0 before).
"""
from __future__ import annotations

import math

REQUIRED_KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                 ("next", "terminated"))


class InvariantError(RuntimeError):
    """A training invariant does not hold."""


class Invariants:
    """Trainer hooks that check the invariants; ``register`` adds them to a torchrl trainer."""

    def __init__(self, trainer, *, sample_shape: tuple[int, ...], steps_per_batch: int, prefill_frames: int,
                 check_every: int = 1, version_offset: int = 0):
        self.trainer = trainer
        self.sample_shape = tuple(sample_shape)
        self.steps_per_batch = steps_per_batch
        self.prefill_frames = prefill_frames
        self.check_every = check_every
        self.collected = 0  # transitions collected by this process
        self.written_at_start = trainer.replay_buffer.write_count
        self.batches = version_offset  # batches collected so far in the whole run (resume included)
        self.optim_at_publication = trainer._optim_count
        self._samples = 0

    def register(self, trainer) -> None:
        trainer.register_op("batch_process", self.check_collected)
        # after the trainer's replay sampler, so this sees the optimisation batch
        trainer.register_op("process_optim_batch", self.check_sample)
        # after the trainer's weight publication (registered in the trainer's constructor)
        trainer.register_op("post_steps", self.check_published)

    def check_collected(self, batch):
        """The batch was collected with the weights published after the previous batch."""
        versions = batch.get(("next", "policy_version"), None)  # the root key lags one step behind
        if versions is not None:
            lo, hi = int(versions.min()), int(versions.max())
            if lo != hi or lo != self.batches:
                raise InvariantError(f"batch {self.batches} carries policy_version {lo}..{hi}; expected {self.batches}")
        if self.trainer._optim_count != self.optim_at_publication:
            raise InvariantError("optimiser steps happened between the weight publication and the collection")
        self.collected += batch.numel()
        return batch

    def check_sample(self, sample):
        """Each optimisation batch has the configured size and the keys the losses read."""
        self._samples += 1
        if self._samples % self.check_every == 0:
            check_sample_batch(sample, shape=self.sample_shape)
        return sample

    def check_published(self) -> None:
        """Replay holds every collected transition; version and optimiser steps follow the documented relation."""
        written = self.trainer.replay_buffer.write_count - self.written_at_start
        if written != self.collected:
            raise InvariantError(f"replay received {written} transitions but {self.collected} were collected")
        optimised = len(self.trainer.replay_buffer) >= self.prefill_frames
        expected = self.steps_per_batch if optimised else 0
        steps = self.trainer._optim_count - self.optim_at_publication
        if steps != expected:
            raise InvariantError(f"batch {self.batches} ran {steps} optimiser steps; expected {expected}")
        self.batches += 1
        self.optim_at_publication = self.trainer._optim_count
        version = self.trainer.collector.policy_version
        if version is not None and version != self.batches:
            raise InvariantError(f"collector policy_version {version} after {self.batches} publications")


def check_sample_batch(sample, *, shape: tuple[int, ...]) -> None:
    """An optimisation batch has ``shape`` and the keys the losses read."""
    if tuple(sample.batch_size) != tuple(shape):
        raise InvariantError(f"sampled batch has shape {tuple(sample.batch_size)}; expected {tuple(shape)}")
    keys = set(sample.keys(True))
    missing = [k for k in REQUIRED_KEYS if k not in keys]
    if missing:
        raise InvariantError(f"sampled batch lacks keys {missing}")


def check_finite(metrics: dict[str, float]) -> None:
    """Every logged metric is a finite number."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(float(v))}
    if bad:
        raise InvariantError(f"non-finite metrics: {bad}")
