"""``python -m offpolicy.plan [algo=...] profile=<name> [key=value ...]``: compose a run's config with every check
train.py makes (a broken invariant is one ``error:`` line and exit 2) and print what the run would do, without
starting Ray or training: collectors and envs, transitions per env, batches per rank, UTD, optimiser steps in total,
and the replay's memory (bytes per transition measured on one copy of the env) against this machine's memory.
The last line is the plan as JSON.
"""
from __future__ import annotations

import json
import math

import psutil
from omegaconf import DictConfig

from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, compose_config
from offpolicy.envs import make_train_env
from offpolicy.replay import optim_steps_per_batch
from shared.config import help_text, run_cli

USAGE = "usage: python -m offpolicy.plan [algo=dqn|sac|ddpg|td3] profile=NAME [key=value ...]"


def transition_bytes(cfg: DictConfig) -> int:
    """Bytes one stored transition takes: a real step of one env copy, with the keys the collector adds
    (policy version, trajectory id)."""
    import torch
    from omegaconf import OmegaConf

    one = OmegaConf.merge(cfg, {"env": {"num_envs": 1, "obs_norm": False}})
    env = make_train_env(one)
    try:
        step = env.rollout(1)[0]
    finally:
        env.close()
    leaves = [t for t in step.values(True, True) if isinstance(t, torch.Tensor)]
    added = 2 * torch.empty((), dtype=torch.int64).element_size()  # policy_version + ("collector", "traj_ids")
    return sum(t.numel() * t.element_size() for t in leaves) + added


def make_plan(cfg: DictConfig) -> dict:
    """The run's numbers; ``cfg`` is already validated by ``compose_config``."""
    ray = cfg.engine == "ray"
    collectors = cfg.ray.num_collectors if ray else 1
    world_size = cfg.ray.world_size if ray else 1
    envs = collectors * cfg.env.num_envs
    per_round = cfg.collector.env_steps_per_batch
    rounds = math.ceil(cfg.total_env_steps / per_round)
    prefill_rounds = max(math.ceil(cfg.collector.prefill_env_steps / per_round) - 1, 0)  # rounds with no optimiser step
    steps = optim_steps_per_batch(cfg)
    per_transition = transition_bytes(cfg)
    replay_bytes = per_transition * cfg.replay.size
    memory = psutil.virtual_memory()
    plan = {
        "algo": cfg.algo, "env": cfg.env.name, "engine": cfg.engine,
        "collectors": collectors, "envs_per_collector": cfg.env.num_envs, "envs": envs,
        "rounds": rounds, "env_steps_per_round": per_round, "env_steps_per_collector_round": per_round // collectors,
        "transitions": rounds * per_round, "transitions_per_env": rounds * per_round / envs,
        "prefill_env_steps": cfg.collector.prefill_env_steps, "prefill_rounds": prefill_rounds,
        "learner_ranks": world_size, "learner_backend": cfg.ray.backend if ray else "local",
        "global_batch": cfg.optim.batch_size, "batch_per_rank": cfg.optim.batch_size // world_size,
        "optim_steps_per_round": steps, "optim_steps_total": (rounds - prefill_rounds) * steps,
        "utd_ratio": cfg.optim.utd_ratio, "replay_ratio": cfg.optim.batch_size * cfg.optim.utd_ratio,
        "replay_size": cfg.replay.size, "bytes_per_transition": per_transition, "replay_bytes": replay_bytes,
        "memory_total_bytes": memory.total, "memory_available_bytes": memory.available,
        "replay_fits_here": replay_bytes < memory.available,
        "evaluations": cfg.total_env_steps // cfg.eval.interval_env_steps if cfg.eval.interval_env_steps else 0,
        "eval_episodes": cfg.eval.episodes, "eval_max_episode_steps": cfg.eval.max_episode_steps,
    }
    if ray:
        from offpolicy.engines.ray import ray_resources

        plan["resources"] = ray_resources(cfg)
    return plan


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def describe(plan: dict) -> list[str]:
    """The plan as lines for people."""
    p = plan
    lines = [
        f"{p['algo']} on {p['env']}, engine {p['engine']}",
        f"collectors: {p['collectors']} x {p['envs_per_collector']:,} envs = {p['envs']:,} envs; "
        f"{p['env_steps_per_round']:,} transitions per round ({p['env_steps_per_collector_round']:,} per collector)",
        f"transitions: {p['transitions']:,} in {p['rounds']:,} rounds = {p['transitions_per_env']:,.0f} per env; "
        f"prefill {p['prefill_env_steps']:,} ({p['prefill_rounds']:,} rounds without optimiser steps)",
        f"learner: {p['learner_ranks']} rank(s) ({p['learner_backend']}), global batch {p['global_batch']:,} = "
        f"{p['batch_per_rank']:,} per rank",
        f"UTD: {p['utd_ratio']:g} optimiser steps per transition = {p['optim_steps_per_round']:,} per round; "
        f"{p['replay_ratio']:g} samples replayed per transition; {p['optim_steps_total']:,} optimiser steps in total",
        f"replay: {p['replay_size']:,} transitions x {p['bytes_per_transition']:,} B = {_gib(p['replay_bytes'])}; "
        f"this machine has {_gib(p['memory_available_bytes'])} available of {_gib(p['memory_total_bytes'])}"
        + ("" if p["replay_fits_here"] else " (does not fit here: needs a bigger replay node)"),
        f"evaluation: {p['evaluations']:,} times x {p['eval_episodes']} episodes of <= "
        f"{p['eval_max_episode_steps']:,} steps",
    ]
    if "resources" in p:
        lines.append(f"Ray resources: {p['resources']['CPU']:g} CPUs, {p['resources']['GPU']:g} GPUs")
    return lines


def main(argv: list[str]) -> int:
    """CLI: print the plan (exit 2 with one ``error:`` line when the config breaks an invariant)."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(CONFIG_DIR, USAGE, ALIASES, GROUPS))
        return 0
    cfg, _ = compose_config(argv)
    plan = make_plan(cfg)
    print("\n".join(describe(plan)))
    print(json.dumps(plan))
    return 0


if __name__ == "__main__":
    run_cli(main)
