"""Invariants checked while training. A broken one raises :class:`InvariantError`, which stops the run (train.py saves
a checkpoint and prints one ``error:`` line).

Documented relation between weights and optimiser steps: the learner's policy is published to the collectors after
every round, so the transitions of round ``k`` (0-based, counted from the start of the run) carry
``policy_version == k`` (``k - 1`` with ``collector.overlap``, whose child collects a round ahead; the first round of a
process carries the version it started from); each round runs exactly ``utd_ratio * env_steps_per_batch``
optimiser steps once replay holds ``prefill_env_steps`` transitions (0 before).
"""
from __future__ import annotations

import math

REQUIRED_KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                 ("next", "terminated"))


class InvariantError(RuntimeError):
    """A training invariant does not hold."""


class RoundInvariants:
    """The per-round invariants, on the round's report (offpolicy/report.py), for every engine:

    - replay received every collected transition (write count against the collectors' counts);
    - every transition of round ``k`` was collected with policy version ``k - policy_lag`` (the engine's, 0 or 1;
      the first round of a process with the version it started from);
    - the learner ran exactly the optimiser steps the loop asked for;
    - after publishing, the collectors hold version ``k + 1``;
    - the learner's metrics, the collected rewards and the finished episodes' returns are finite numbers.

    The sampled-batch invariants are checked by the learner (learner.py), where the samples are.
    """

    def __init__(self, writes_at_start: int, policy_lag: int = 0):
        self.writes_at_start = writes_at_start
        self.policy_lag = policy_lag
        self.first_round: int | None = None  # this process's first round (a resumed run starts later)
        self.replay_writes = writes_at_start  # replay's write count after the latest round
        self.collected = 0  # transitions collected by this process (a resumed run starts at 0 again)

    def check(self, report) -> None:
        self.collected += report.rollout.env_steps
        self.replay_writes = report.replay_writes
        written = report.replay_writes - self.writes_at_start
        if written != self.collected:
            raise InvariantError(f"replay received {written} transitions but {self.collected} were collected")
        if self.first_round is None:
            self.first_round = report.index
        lo, hi = report.rollout.version_lo, report.rollout.version_hi
        expected = max(self.first_round, report.index - self.policy_lag)
        if lo is not None and (lo, hi) != (expected, expected):
            raise InvariantError(f"batch {report.index} carries policy_version {lo}..{hi}; expected {expected}")
        if report.steps_done != report.steps_asked:
            raise InvariantError(f"batch {report.index} ran {report.steps_done} optimiser steps; expected "
                                 f"{report.steps_asked}")
        if report.published != report.index + 1:
            raise InvariantError(f"collector policy_version {report.published} after {report.index + 1} "
                                 "publications")
        rollout = report.rollout
        check_finite({**report.learned, "collector/reward_sum": rollout.reward_sum,
                      **{f"train/return[{i}]": r for i, r in enumerate(rollout.returns)}})


def check_sample_batch(sample, *, shape: tuple[int, ...]) -> None:
    """An optimisation batch has ``shape`` and the keys the losses read."""
    if tuple(sample.batch_size) != tuple(shape):
        raise InvariantError(f"sampled batch has shape {tuple(sample.batch_size)}; expected {tuple(shape)}")
    keys = set(sample.keys(True))
    missing = [k for k in REQUIRED_KEYS if k not in keys]
    if missing:
        raise InvariantError(f"sampled batch lacks keys {missing}")


def check_finite(metrics: dict[str, float]) -> None:
    """Every value of ``metrics`` is a finite number."""
    bad = {k: v for k, v in metrics.items() if not math.isfinite(float(v))}
    if bad:
        raise InvariantError(f"non-finite metrics: {bad}")
