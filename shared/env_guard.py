"""A user's env failing is an event of the run, not a crash: every Gymnasium env a run steps is made by
:func:`make_gym`, which wraps it in :class:`EnvGuard`. An exception in ``reset``/``step``, or a non-finite
observation or reward, becomes an :class:`EnvFault` naming the env, the copy's env step and the cause, raised before
the policy sees the value (a NaN observation fed to SAC's actor ended a run with "normal expects all elements of std
>= 0.0"). The run ends on it with its own exit code, at the last whole round (offpolicy/run.py).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import gymnasium
import numpy as np

from shared.files import atomic_write_text


class EnvFault(RuntimeError):
    """The user's env raised in ``reset``/``step`` or returned a non-finite observation or reward."""

    def __init__(self, env: str, step: int, cause: str):
        super().__init__(f"env {env!r} failed at env step {step} of its copy: {cause}")
        self.env, self.step, self.cause = env, step, cause

    def __reduce__(self):  # crosses process boundaries (env workers, the overlap child, Ray actors) intact
        return type(self), (self.env, self.step, self.cause)


def env_fault_of(exc: BaseException | None) -> EnvFault | None:
    """The :class:`EnvFault` behind ``exc``: itself, the cause a Ray task error carries, or one it was raised from."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError: the remote exception
        if isinstance(cause, EnvFault):
            return cause
        if isinstance(exc, EnvFault):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("(no message)" for none): what one-line errors quote of it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}" if str(exc).strip() else type(exc).__name__


def _non_finite(value) -> str | None:
    """Where ``value`` (an observation) is not finite, or None; non-float observations are always finite."""
    array = np.asarray(value)
    if array.dtype.kind not in "fc" or np.isfinite(array).all():
        return None
    index = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
    return f"{array[index]} at index {list(index)}"


class EnvGuard(gymnasium.Wrapper):
    """Checks every ``reset``/``step`` of ``env`` (Gymnasium id ``name``) and turns a failure into an
    :class:`EnvFault`; with ``report_dir`` (an env worker process) the fault is written there
    (:func:`reported_fault`) and the process ends."""

    def __init__(self, env: gymnasium.Env, name: str, report_dir: Path | None = None):
        super().__init__(env)
        self.name, self.report_dir = name, report_dir
        self.steps = 0  # this copy's env steps, the failing one included

    def _fault(self, cause: str) -> EnvFault:
        """The fault to raise; a reporting guard (an env worker process) writes it and ends its process quietly
        instead (exit code 1: the caller raises the reported fault; a traceback from every worker would bury it)."""
        fault = EnvFault(self.name, self.steps, cause)
        if self.report_dir is not None:
            atomic_write_text(self.report_dir / f"fault-{os.getpid()}.json",
                              json.dumps({"env": fault.env, "step": fault.step, "cause": fault.cause}))
            raise SystemExit(1)
        return fault

    def reset(self, **kwargs):
        try:
            observation, info = self.env.reset(**kwargs)
        except Exception as exc:  # noqa: BLE001 - the user's code: any error is the env's fault
            raise self._fault(f"reset raised {_describe(exc)}") from exc
        bad = _non_finite(observation)
        if bad is not None:
            raise self._fault(f"reset returned a non-finite observation ({bad})")
        return observation, info

    def step(self, action):
        self.steps += 1
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
        except Exception as exc:  # noqa: BLE001 - the user's code: any error is the env's fault
            raise self._fault(f"step raised {_describe(exc)}") from exc
        bad = _non_finite(observation)
        if bad is not None:
            raise self._fault(f"step returned a non-finite observation ({bad})")
        if not math.isfinite(reward):
            raise self._fault(f"step returned a non-finite reward ({reward})")
        return observation, reward, terminated, truncated, info


def make_gym(name: str, report_dir: Path | None = None, **kwargs) -> EnvGuard:
    """``gymnasium.make(name, **kwargs)`` inside an :class:`EnvGuard` (reporting to ``report_dir``). Only the
    keywords given reach the env's constructor (torchrl's ``GymEnv`` adds ``frameskip=1``, which an env class without
    that argument refuses)."""
    return EnvGuard(gymnasium.make(name, **kwargs), name, report_dir)


def reported_fault(report_dir: Path) -> EnvFault | None:
    """The first fault a guard wrote to ``report_dir``, for envs stepped in worker processes whose exception does not
    reach this one (torchrl's ``ParallelEnv`` reports only that a worker exited)."""
    for path in sorted(Path(report_dir).glob("fault-*.json")):
        return EnvFault(**json.loads(path.read_text()))
    return None
