"""Whether a run compiles its learner step and collection policy with ``torch.compile`` (``compile.enabled``).

``auto`` (the default) compiles when the run's planned optimiser steps reach ``compile.auto_min_optim_steps``: compiling
costs seconds once and saves a little on every step, so only a run long enough to repay it compiles (the threshold and
its measurements: docs/results.md, "Off-policy engine"). Smoke runs (a few hundred steps) stay eager. ``true`` and
``false`` force either path.

When ``torch.compile`` cannot compile on this platform (no C++ compiler for inductor, an unsupported Python), the run
falls back to eager with one warning line naming the reason; a step whose compilation fails later falls back in the
learner (offpolicy/learner.py).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from offpolicy.algos import algorithm


@dataclass(frozen=True)
class CompileChoice:
    """The path a run takes (``enabled``) and why (``reason``, for the start line)."""

    enabled: bool
    reason: str

    def describe(self) -> str:
        return f"{'compiled' if self.enabled else 'eager'} ({self.reason})"


def planned_optim_steps(cfg: DictConfig) -> int:
    """Optimiser steps the whole run makes, as the loop counts them: every round from the first whose batch brings
    replay to the prefill on (that round included) runs ``utd_ratio * env_steps_per_batch`` steps."""
    batch = cfg.collector.env_steps_per_batch
    rounds = -(-cfg.total_env_steps // batch)
    first_learning = max(1, -(-cfg.collector.prefill_env_steps // batch))
    return max(0, rounds - first_learning + 1) * round(cfg.optim.utd_ratio * batch)


def compile_choice(cfg: DictConfig) -> CompileChoice:
    """Whether this run compiles (the learner step and a TensorDict collection policy), by ``compile.enabled``."""
    setting = cfg.compile.enabled
    if setting is False:
        return CompileChoice(False, "compile.enabled=false")
    if not algorithm(cfg.algo).compiles:
        return CompileChoice(False, f"{cfg.algo}'s loss does not run under torch.compile")
    if setting == "auto":
        steps, least = planned_optim_steps(cfg), cfg.compile.auto_min_optim_steps
        if steps < least:
            return CompileChoice(False, f"compile.enabled=auto: {steps:,} planned optimiser steps < {least:,}")
        reason = f"compile.enabled=auto: {steps:,} planned optimiser steps >= {least:,}"
    else:
        reason = "compile.enabled=true"
    failure = compiler_failure()
    if failure is not None:
        return CompileChoice(False, f"{reason}, but torch.compile fails here: {failure}")
    return CompileChoice(True, reason)


def _probe(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).relu().sum()


@functools.cache
def compiler_failure() -> str | None:
    """None when ``torch.compile`` compiles and runs a small function in this process (~1-3 s, once), else the
    reason (``ExceptionType: first line``), also printed once as a warning line."""
    try:
        out = torch.compile(_probe, fullgraph=True)(torch.arange(-2.0, 2.0))
        if float(out) != 2.0:
            raise RuntimeError(f"the compiled probe returned {float(out)}, not 2.0")
    except Exception as exc:  # any failure of the compiler stack means: run eager
        reason = describe_failure(exc)
        print(f"warning: torch.compile fails here ({reason}); the run is eager", file=sys.stderr, flush=True)
        return reason
    return None


def describe_failure(exc: BaseException) -> str:
    """``ExceptionType: first line of its message`` (compiler errors span pages)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
