"""What one round of the loop reports, the same for every engine."""
from __future__ import annotations

from dataclasses import dataclass

from offpolicy.collect.statistics import Rollout


@dataclass
class RoundReport:
    """One round: what was collected and written, what the learner did, what the collectors hold now."""

    index: int  # rounds before this one = the policy version this round's batch was collected with
    rollout: Rollout
    replay_writes: int  # replay's write count after the round
    replay_size: int
    steps_asked: int  # optimiser steps the loop asked for (UTD x env steps once prefilled, else 0)
    steps_done: int  # optimiser steps the learner ran
    learned: dict[str, float]  # the learner's loss/ and replay/ metrics
    published: int  # the collectors' policy version after publishing
    collect_s: float
    learn_s: float
