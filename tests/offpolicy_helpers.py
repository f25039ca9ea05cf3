"""Helpers of the off-policy tests: run the entry point in-process or as a subprocess, read a run's files."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m offpolicy.train args...`` from the repo root, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "offpolicy.train", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def train_inprocess(*args: str):
    """Compose the config from ``args`` and train in this process; returns the summary dict."""
    from offpolicy.train import compose_config, train

    cfg, checkpoint = compose_config(list(args))
    return train(cfg, checkpoint)


def summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def smoke_parts(algo: str, *overrides: str):
    """``profile=smoke`` parts of ``algo`` on its smoke env (DQN on CartPole, the others on Pendulum) built from seed
    0, and one collected batch, flattened: returns ``(cfg, env, parts, batch)`` (``env`` gives specs; its collector
    is shut)."""
    import torch

    from offpolicy.algos import algorithm
    from offpolicy.builder import Builder
    from offpolicy.config import compose_config
    from offpolicy.envs import make_train_env

    cfg, _ = compose_config([f"algo={algo}", f"env={algorithm(algo).smoke_env}", "profile=smoke", *overrides])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    try:
        batch = next(iter(collector)).reshape(-1)
    finally:
        collector.shutdown()
    return cfg, env, parts, batch


def window_length(ended: list[bool], t: int, n: int) -> int:
    """Steps of step ``t``'s n-step window within one env's batch, by plain counting (a reference independent of
    offpolicy/replay/nstep.py): it stops after an ended step (``ended``: the batch's per-step end flags) and at the
    batch's end."""
    k = 1
    while k < n and not ended[t + k - 1] and t + k < len(ended):
        k += 1
    return k


@contextlib.contextmanager
def compiled_random_as_eager():
    """Inside: what torch.compile compiles draws its random numbers as eager torch does, so a compiled step and its
    eager twin seeded alike draw the same noise (inductor's own random kernels, the default, draw other numbers). Test
    support only, which is why it may use torch's private ``torch._inductor.config`` (``fallback_random``, torch 2.13)
    outside shared/compat.py: no run depends on it; test_offpolicy_compile.py checks that it does what it says."""
    from torch._inductor import config

    with config.patch(fallback_random=True):
        yield
