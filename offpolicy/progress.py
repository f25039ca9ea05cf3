"""The run's counters (:class:`Progress`): what a checkpoint saves of where a run stands, read back by a resume, the
evaluation and export CLIs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    """The run's counters (checkpointed; a resumed run continues them)."""

    env_steps: int = 0  # collected transitions (env steps summed over envs)
    optim_steps: int = 0
    batches: int = 0  # rounds = weight publications
    episodes: int = 0
    start_elapsed_s: float = 0.0
    stop_return_reached: dict | None = None  # the evaluation that first reached eval.stop_return (kept over resumes)
    started: float = field(default_factory=time.perf_counter)

    @property
    def elapsed_s(self) -> float:
        return self.start_elapsed_s + time.perf_counter() - self.started

    def advance(self, report) -> None:
        """Count one round (a :class:`~offpolicy.report.RoundReport`)."""
        self.env_steps += report.rollout.env_steps
        self.optim_steps += report.steps_done
        self.batches += 1
        self.episodes += len(report.rollout.returns)

    def state_dict(self) -> dict:
        return {"env_steps": self.env_steps, "optim_steps": self.optim_steps, "batches": self.batches,
                "episodes": self.episodes, "elapsed_s": self.elapsed_s,
                "stop_return_reached": self.stop_return_reached}

    @classmethod
    def from_state(cls, state: dict | None) -> "Progress":
        """The counters of :meth:`state_dict` (a checkpoint's, in the current format); None: a new run's."""
        if not state:
            return cls()
        return cls(env_steps=state["env_steps"], optim_steps=state["optim_steps"], batches=state["batches"],
                   episodes=state["episodes"], start_elapsed_s=state["elapsed_s"],
                   stop_return_reached=state["stop_return_reached"])
