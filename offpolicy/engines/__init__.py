"""Where the loop's parts run: ``engine=local`` (this process) or ``engine=ray`` (collector actors, a replay actor and
learner ranks). :func:`engine_class` is the one place an engine is found by its name; its module is imported only
then, so a local run never imports Ray's."""
from __future__ import annotations

import importlib
import os

import torch

from offpolicy.engines.base import Engine

ENGINES = {"local": "offpolicy.engines.local:LocalEngine", "ray": "offpolicy.engines.ray:RayEngine"}


def engine_class(name: str) -> type[Engine]:
    """The engine called ``name`` (a name the config rule has accepted)."""
    module, _, cls = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def learner_device(cfg) -> torch.device:
    """The device this run's learner computes on: CUDA for ``engine=ray ray.backend=nccl``, the CPU otherwise (the
    local engine learns on the CPU)."""
    return torch.device("cuda" if cfg.engine == "ray" and cfg.ray.backend == "nccl" else "cpu")


def learner_threads(cfg) -> int:
    """torch intra-op threads of this run's learner (``threads``): a number as given; ``auto`` (the default) every
    core the learner can have: on ``engine=local`` the CPUs this process may run on (``OMP_NUM_THREADS`` where set,
    as torch itself honours it), less one with ``collector.overlap`` (its child process collects on that core); on
    ``engine=ray`` the CPUs Ray reserves for each rank (``ray.learner_cpus``). Measured on the 2-core host
    (2026-12-06, docs/results.md): two threads make the learner step 1.38-1.41x faster at batch 256 with 256x256 MLPs
    (SAC, TD3, DDPG) and 1.04-1.15x for smaller ones (DQN on CartPole), never slower."""
    if cfg.threads != "auto":
        return cfg.threads
    if cfg.engine == "ray":
        return max(1, int(cfg.ray.learner_cpus))
    omp = os.environ.get("OMP_NUM_THREADS", "")
    cores = int(omp) if omp.isdigit() and int(omp) > 0 else len(os.sched_getaffinity(0))
    return max(1, cores - (1 if cfg.collector.overlap else 0))
