"""Rates measured on this machine, in seconds, for :mod:`offpolicy.tools.plan`'s wall-time prediction. Every figure
comes from the engine's own parts (the training env of each backend, the collector with the run's policy, the replay
buffer, the learner) doing the run's work at the run's sizes, or at the largest size measured when the run's does not
fit here (then marked ``extrapolated``)."""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf

ENV_BATCHES = (1, 64, 1024)  # batch sizes of the per-backend env-step table
MAX_MEASURED_ENVS = 1024  # collector batches above this are measured at 1024 and scaled linearly per env
MAX_BATCH_STEPS = 50  # collector batches are timed over at most this many steps of every env
MAX_WRITE = 100_000  # replay writes are timed with one round's transitions, at most this many
MIN_TIME_S = 0.3  # each rate is timed over at least this long (and at least 2 repetitions)


@dataclass
class Rates:
    """Seconds per unit of work on this machine."""

    env_step_s: dict[str, dict[int, float]] = field(default_factory=dict)  # backend -> batch -> one batched step
    collector_step_s: float = 0.0  # one collector step of env.num_envs envs: policy forward + env step + bookkeeping
    collector_batch: int = 1  # the batch collector_step_s was measured at
    policy_forward_s: float = 0.0  # the stochastic policy at collector_batch
    replay_write_s: float = 0.0  # per transition written
    update_s: float = 0.0  # one optimiser step (with its target update) at update_batch
    update_batch: int = 1
    eval_step_s: float = 0.0  # one deterministic step of the (single) evaluation env
    setup_s: float = 0.0  # building the training env, the parts and the collector at the run's size
    param_bytes: int = 0  # trainable parameters, what learner ranks all-reduce every step
    matmul_flops: float = 0.0  # fp32 matmul throughput here (the reference for GPU factors)
    threads: int = 1  # torch threads
    cores: int = 1  # this machine's cores: envpool's thread pool has one thread per core

    def as_dict(self) -> dict:
        return asdict(self)


def _timed(fn, min_time_s: float = MIN_TIME_S, min_reps: int = 2) -> float:
    """Mean seconds per call of ``fn`` after one warm-up call."""
    fn()
    reps, start = 0, time.perf_counter()
    while reps < min_reps or time.perf_counter() - start < min_time_s:
        fn()
        reps += 1
    return (time.perf_counter() - start) / reps


def _with(cfg: DictConfig, **changes) -> DictConfig:
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for key, value in changes.items():
        OmegaConf.update(out, key, value)
    return out


def env_step_table(cfg: DictConfig, backends: tuple[str, ...], batches=ENV_BATCHES) -> dict[str, dict[int, float]]:
    """Seconds per batched random-action step of the training env, per backend and batch size."""
    from offpolicy.builder import Builder

    table: dict[str, dict[int, float]] = {}
    for backend in backends:
        table[backend] = {}
        for n in batches:
            env = Builder(_with(cfg, **{"env.backend": backend, "env.num_envs": n, "env.obs_norm": False})).train_env()
            try:
                state = {"td": env.reset()}

                def step():
                    state["td"] = env.step_and_maybe_reset(env.rand_action(state["td"]))[1]
                table[backend][n] = _timed(step)
            finally:
                env.close()
    return table


def matmul_flops() -> float:
    """fp32 matmul FLOP/s here (1024^2 by 1024^2): the roofline GPU factors are stated against."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / _timed(lambda: a @ b, min_time_s=0.2)


def measure(cfg: DictConfig, backends: tuple[str, ...] = ()) -> Rates:
    """Measure the run's rates (``cfg`` validated); ``backends`` also get the env-step table."""
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    from offpolicy.builder import Builder
    from offpolicy.collect.statistics import for_replay
    from offpolicy.engines import engine_class
    from offpolicy.learner import SAMPLE_CHUNK

    engine = engine_class(cfg.engine)
    threads = engine.learner_threads(cfg)
    torch.set_num_threads(threads)
    rates = Rates(threads=threads, cores=os.cpu_count() or 1, matmul_flops=matmul_flops())
    n = min(cfg.env.num_envs, MAX_MEASURED_ENVS)
    world, collectors = engine.learner_ranks(cfg), engine.collectors(cfg)
    per_rank = cfg.optim.batch_size // world
    round_size = cfg.collector.env_steps_per_batch
    t = max(min(round_size // collectors // cfg.env.num_envs, MAX_BATCH_STEPS), 1)  # steps per measured batch
    write_size = max(min(round_size, MAX_WRITE) // n * n, n)  # whole steps of the n envs (n-step and frame replay)
    run = _with(cfg, **{"env.num_envs": n, "optim.batch_size": per_rank, "replay.storage": "memory",
                        "replay.size": max(2 * per_rank, 2 * write_size, t * n),
                        "collector.env_steps_per_batch": t * n})
    start = time.perf_counter()
    builder = Builder(run)  # the parts a run builds, at the measured sizes
    env = builder.train_env()
    parts = builder.parts(env)
    collector = builder.collector(env, parts.collect_policy)
    batches = iter(collector)
    first = next(batches)
    rates.setup_s = time.perf_counter() - start
    try:
        rates.collector_batch = n
        rates.collector_step_s = _timed(lambda: next(batches)) / t  # a batch is t steps of n envs
        obs = first.reshape(-1)[:n].exclude("next", "action")  # any n observations: the cost is the batch size's
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            rates.policy_forward_s = _timed(lambda: parts.collect_policy(obs.clone()))
        replay = builder.replay()
        transitions = for_replay(first)
        transitions = torch.cat([transitions] * math.ceil(write_size / transitions.numel()))[:write_size]
        rates.replay_write_s = _timed(lambda: replay.extend(transitions)) / write_size  # one round's write
        while len(replay) < per_rank:
            replay.extend(transitions)
        learner = builder.learner(parts, env.action_spec_unbatched)
        version = 1 << 30  # any stored policy version is older
        rates.update_batch = per_rank
        rates.param_bytes = sum(p.numel() * p.element_size() for opt in parts.optimizers.values()
                                for group in opt.param_groups for p in group["params"])
        k = max(min(round(cfg.optim.utd_ratio * round_size), SAMPLE_CHUNK), 1)  # steps per call, as in a round
        rates.update_s = _timed(lambda: learner.update(replay, k, version), min_reps=3) / k
    finally:
        collector.shutdown()
    eval_env = builder.eval_env()
    try:
        td = {"td": eval_env.reset()}

        def eval_step():
            with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                td["td"] = eval_env.step_and_maybe_reset(parts.eval_policy(td["td"]))[1]
        rates.eval_step_s = _timed(eval_step)
    finally:
        eval_env.close()
    if backends:  # last: building 1,024 Gymnasium copies first slowed the learner update measured after them
        rates.env_step_s = env_step_table(cfg, backends)
    return rates
