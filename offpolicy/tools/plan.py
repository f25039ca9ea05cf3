"""``python -m offpolicy.tools.plan [algo=...] profile=<name> [key=value ...] [measure=false]``: compose a run's config
with every check train.py makes (a broken invariant is one ``error:`` line and exit 2) and print what the run would
do, without starting Ray or training: collectors and envs, transitions per env, batches per rank, UTD, optimiser
steps in total, the replay's memory (bytes per transition: one step of one env copy written into the run's kind of
replay) against this machine's memory; then, from rates measured here (:mod:`offpolicy.tools.rates`), the time of one
round for collectors, replay writes and learners, which of them bounds the round, and the predicted wall time of the
prefill and of the whole run.
Hardware this machine lacks (GPU collectors and learners, NCCL) is scaled from the measured CPU figures by the
factors in :data:`ESTIMATES`, each printed with its source. The last line is the plan as JSON.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import psutil
from omegaconf import DictConfig

from offpolicy import prepare_process
from offpolicy.algos import ALGOS
from offpolicy.builder import Builder
from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, compose_config, reference
from offpolicy.engines import engine_class
from offpolicy.envs import eval_max_steps
from offpolicy.run import optim_steps_per_batch
from shared.config import ConfigError, help_text, run_cli

USAGE = f"usage: python -m offpolicy.tools.plan [algo={'|'.join(ALGOS)}] profile=NAME [key=value ...]"


def transition_bytes(cfg: DictConfig) -> int:
    """Bytes one stored transition takes in the run's replay: one step of one env copy, collected by the run's kind
    of collector (torchrl's keeps more than ours: root copies of the done flags, the policy's outputs) and written into
    a replay built as the run builds it (n-step windows add ``steps_to_next_obs``, the buffer an ``index``); with
    ``replay.frames_once``, one frame and its slot's fields."""
    import torch
    from omegaconf import OmegaConf

    from offpolicy.collect.lean import lean_collection
    from offpolicy.collect.statistics import for_replay

    if cfg.replay.frames_once:
        from offpolicy.replay.frames import frame_replay_bytes_per_transition

        return frame_replay_bytes_per_transition(cfg.replay.size, cfg.env.num_envs, cfg.env.atari.frame_stack,
                                                 cfg.env.atari.image_size)

    # one copy (the run's collector kind kept), a replay of one transition in memory: a row of it is what the
    # run's storage allocates per transition
    lean = lean_collection(cfg, engine_class(cfg.engine).collects_on_cpu(cfg))
    one = OmegaConf.merge(cfg, {"env": {"num_envs": 1, "obs_norm": False}, "compile": {"enabled": False},
                                "collector": {"lean": lean},
                                "replay": {"size": 1, "storage": "memory"}})
    builder = Builder(one)
    env = builder.train_env()
    collector = builder.collector(env, builder.parts(env).collect_policy, env_steps_per_batch=1)  # closes env
    try:
        step = for_replay(next(iter(collector)))
    finally:
        collector.shutdown()
    replay = builder.replay()
    torchrl_log = logging.getLogger("torchrl")  # its storage announces the allocation on stdout, before the plan
    level = torchrl_log.level
    torchrl_log.setLevel(logging.WARNING)
    try:
        replay.extend(step)
    finally:
        torchrl_log.setLevel(level)
    return replay.storage.get(torch.zeros(1, dtype=torch.int64)).bytes()


def make_plan(cfg: DictConfig) -> dict:
    """The run's numbers; ``cfg`` is already validated by ``compose_config``."""
    engine = engine_class(cfg.engine)
    threads = engine.learner_threads(cfg)
    layout = engine.plan(cfg)
    collectors, world_size = layout["collectors"], layout["learner_ranks"]
    envs = collectors * cfg.env.num_envs
    per_round = cfg.collector.env_steps_per_batch
    rounds = math.ceil(cfg.total_env_steps / per_round)
    prefill_rounds = max(math.ceil(cfg.collector.prefill_env_steps / per_round) - 1, 0)  # rounds with no optimiser step
    steps = optim_steps_per_batch(cfg)
    per_transition = transition_bytes(cfg)
    replay_bytes = per_transition * cfg.replay.size
    memory = psutil.virtual_memory()
    plan = {
        "algo": cfg.algo, "env": cfg.env.name, "engine": cfg.engine, "collector_overlap": bool(cfg.collector.overlap),
        "collectors": collectors, "envs_per_collector": cfg.env.num_envs, "envs": envs,
        "rounds": rounds, "env_steps_per_round": per_round, "env_steps_per_collector_round": per_round // collectors,
        "transitions": rounds * per_round, "transitions_per_env": rounds * per_round / envs,
        "prefill_env_steps": cfg.collector.prefill_env_steps, "prefill_rounds": prefill_rounds,
        "learner_ranks": world_size, "learner_backend": layout["learner_backend"],
        "global_batch": cfg.optim.batch_size, "batch_per_rank": cfg.optim.batch_size // world_size,
        "optim_steps_per_round": steps, "optim_steps_total": (rounds - prefill_rounds) * steps,
        "utd_ratio": cfg.optim.utd_ratio, "replay_ratio": cfg.optim.batch_size * cfg.optim.utd_ratio,
        "replay_size": cfg.replay.size, "bytes_per_transition": per_transition, "replay_bytes": replay_bytes,
        "memory_total_bytes": memory.total, "memory_available_bytes": memory.available,
        "replay_fits_here": replay_bytes < memory.available,
        "evaluations": cfg.total_env_steps // cfg.eval.interval_env_steps if cfg.eval.interval_env_steps else 0,
        "eval_interval_env_steps": cfg.eval.interval_env_steps,
        "eval_episodes": cfg.eval.episodes, "eval_max_episode_steps": eval_max_steps(cfg),  # Atari: whole games
        "final_eval_episodes": cfg.eval.final_episodes, "backend": cfg.env.backend, "threads": threads,
        "collector_cpus": layout["collector_cpus"], "collector_gpus": layout["collector_gpus"],
        "learner_gpus": layout["learner_gpus"], "resources": layout["resources"], "ray_actors": layout["ray_actors"],
    }
    return plan


@dataclass(frozen=True)
class Estimate:
    """A factor for hardware this machine lacks, with where it comes from."""

    value: float
    source: str


H200_FP32_FLOPS = 67e12
ESTIMATES = {
    "gpu_utilisation": Estimate(0.3, "assumed share of the H200's 67 TFLOPS fp32 (NVIDIA H200 datasheet) that MLP "
                                     "updates and policy forwards of these sizes reach"),
    "gpu_update_floor_s": Estimate(2e-3, "assumed: ~200 CUDA kernel launches of ~10 us per torchrl loss "
                                         "forward+backward+Adam step, without CUDA graphs"),
    "gpu_forward_floor_s": Estimate(2e-4, "assumed: ~20 kernel launches of ~10 us per policy forward"),
    "nccl_bytes_per_s": Estimate(100e9, "assumed all-reduce bus bandwidth over NVLink (H200 NVLink is 900 GB/s "
                                        "peak; NCCL tests reach a fraction at these message sizes)"),
    "nccl_latency_s": Estimate(3e-5, "assumed latency of one NCCL all-reduce within a node"),
    "gloo_bytes_per_s": Estimate(2e9, "assumed Gloo all-reduce bandwidth over loopback TCP on one machine"),
    "ray_round_factor": Estimate(1 / 0.76, "measured: the Ray engine (1 collector, 1 rank) ran SAC at 0.73-0.79x "
                                           "the local engine here (benchmarks/ray_vs_local.py, README)"),
    "envpool_core_scaling": Estimate(1.0, "assumed: envpool's thread pool steps scale linearly with cores (the "
                                          "envpool paper, Weng et al. 2022, reports near-linear scaling)"),
}


def predict(plan: dict, rates: dict, estimates: dict[str, Estimate] = ESTIMATES) -> dict:
    """Per-round times (collect, replay write, learn), the bound, and predicted wall time of the prefill and the whole
    run, from the plan's counts and the measured ``rates`` (:class:`offpolicy.tools.rates.Rates` as a dict). Figures for
    hardware this machine lacks use ``estimates`` and are listed under ``"estimated"``."""
    est = {k: e.value for k, e in estimates.items()}
    used: list[str] = []
    n, b = plan["envs_per_collector"], rates["collector_batch"]
    per_env = n / b  # a collector step of n envs costs per_env times the measured one of b envs
    policy_s, step_s = rates["policy_forward_s"], rates["collector_step_s"]
    gpu_factor = est["gpu_utilisation"] * H200_FP32_FLOPS / rates["matmul_flops"]
    if plan["collector_gpus"] > 0:  # the policy runs on the collector's GPU, the envs on its CPUs
        gpu_policy_s = max(policy_s * per_env / gpu_factor, est["gpu_forward_floor_s"])
        used += ["gpu_utilisation", "gpu_forward_floor_s"]
        step_s, policy_s = (step_s - policy_s) * per_env, gpu_policy_s
    else:
        step_s, policy_s = (step_s - policy_s) * per_env, policy_s * per_env
    if plan["backend"] == "envpool" and plan["collector_cpus"] > rates["cores"]:
        step_s *= rates["cores"] / (plan["collector_cpus"] * est["envpool_core_scaling"])
        used.append("envpool_core_scaling")
    collector_step_s = step_s + policy_s
    steps_per_round = plan["env_steps_per_collector_round"] / n  # collectors step in parallel
    collect_s = steps_per_round * collector_step_s
    write_s = plan["env_steps_per_round"] * rates["replay_write_s"]
    update_s = rates["update_s"]
    if plan["learner_gpus"] > 0:
        update_s = max(update_s / gpu_factor, est["gpu_update_floor_s"])
        used += ["gpu_utilisation", "gpu_update_floor_s"]
    if plan["learner_ranks"] > 1:
        nccl = plan["learner_backend"] == "nccl"
        moved = 2 * rates["param_bytes"] * (plan["learner_ranks"] - 1) / plan["learner_ranks"]
        update_s += moved / est["nccl_bytes_per_s" if nccl else "gloo_bytes_per_s"] + (est["nccl_latency_s"] if
                                                                                        nccl else 0.0)
        used += ["nccl_bytes_per_s", "nccl_latency_s"] if nccl else ["gloo_bytes_per_s"]
    learn_s = plan["optim_steps_per_round"] * update_s
    overhead = 1.0
    if plan["ray_actors"]:
        overhead = est["ray_round_factor"]
        used.append("ray_round_factor")
    parts = {"collect": collect_s, "replay_write": write_s, "learn": learn_s}
    if plan["collector_overlap"]:  # a child collects the next batch while this process writes and learns
        round_s = max(collect_s, write_s + learn_s) * overhead
    else:  # the loop collects, writes, then learns, one after the other
        round_s = sum(parts.values()) * overhead
    prefill_round_s = (collect_s + write_s) * overhead
    learning_rounds = plan["rounds"] - plan["prefill_rounds"]
    # evaluations play full-length episodes at most; background ones overlap training (a thread on weight
    # snapshots, which keeps only the newest request), the final one comes after it
    episode_s = plan["eval_max_episode_steps"] * rates["eval_step_s"]
    eval_s = plan["eval_episodes"] * episode_s
    between_evals_s = plan["eval_interval_env_steps"] / plan["env_steps_per_round"] * round_s
    final_eval_s = plan["final_eval_episodes"] * episode_s
    setup_s = rates["setup_s"] * max(per_env, 1.0)
    prefill_s = plan["prefill_rounds"] * prefill_round_s
    total_s = setup_s + prefill_s + learning_rounds * round_s + final_eval_s
    return {
        "collector_step_s": collector_step_s, "round_s": round_s, "round_parts_s": parts,
        "bound": max(parts, key=parts.get), "prefill_s": prefill_s, "learning_s": learning_rounds * round_s,
        "eval_s": eval_s, "between_evals_s": between_evals_s,
        "evals_keep_up": not plan["evaluations"] or eval_s <= between_evals_s,
        "final_eval_s": final_eval_s, "setup_s": setup_s, "total_s": total_s, "extrapolated": n > b,
        "estimated": {k: {"value": estimates[k].value, "source": estimates[k].source} for k in dict.fromkeys(used)},
    }


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def describe_timing(plan: dict, rates: dict, timing: dict) -> list[str]:
    """The measured rates and the prediction as lines for people."""
    t, parts = timing, timing["round_parts_s"]
    lines = ["measured here (s): " + ", ".join(
        f"{name} {rates[key]:.3g}" for name, key in (("collector step", "collector_step_s"),
                                                    ("policy forward", "policy_forward_s"),
                                                    ("replay write per transition", "replay_write_s"),
                                                    ("learner update", "update_s"), ("eval step", "eval_step_s"),
                                                    ("setup", "setup_s")))
             + f" (collector batch {rates['collector_batch']:,}, update batch {rates['update_batch']:,}, "
               f"{rates['threads']} threads, matmul {rates['matmul_flops'] / 1e9:.0f} GFLOP/s)"]
    for backend, table in rates["env_step_s"].items():
        lines.append(f"env step, {backend}: " + ", ".join(
            f"batch {n:,} {s * 1e3:.3g} ms ({s / n * 1e6:.3g} us/env)" for n, s in table.items()))
    lines += [
        f"round: collect {_duration(parts['collect'])} {'beside' if plan['collector_overlap'] else '+'} replay write "
        f"{_duration(parts['replay_write'])} + learn {_duration(parts['learn'])} = {_duration(t['round_s'])}; bound by "
        f"{t['bound']}"
        + (" (collector step extrapolated per env from the measured batch)" if t["extrapolated"] else ""),
        f"predicted wall time: setup {_duration(t['setup_s'])} + prefill {_duration(t['prefill_s'])} + learning "
        f"{_duration(t['learning_s'])} + final evaluation <= {_duration(t['final_eval_s'])} = "
        f"{_duration(t['total_s'])}",
    ]
    if plan["evaluations"]:
        lines.append(f"background evaluation: <= {_duration(t['eval_s'])} each, every {_duration(t['between_evals_s'])}"
                     + ("" if t["evals_keep_up"] else " (does not keep up: the evaluator keeps only the newest "
                                                      "request, so some evaluations are skipped)"))
    for name, e in t["estimated"].items():
        lines.append(f"  estimate {name} = {e['value']:g}: {e['source']}")
    return lines


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def describe(plan: dict) -> list[str]:
    """The plan as lines for people."""
    p = plan
    lines = [
        f"{p['algo']} on {p['env']}, engine {p['engine']}",
        f"collectors: {p['collectors']} x {p['envs_per_collector']:,} envs ({p['backend']}) = {p['envs']:,} envs; "
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
    if p["ray_actors"]:
        lines.append(f"Ray resources: {p['resources']['CPU']:g} CPUs, {p['resources']['GPU']:g} GPUs")
    return lines


def main(argv: list[str]) -> int:
    """CLI: print the plan (exit 2 with one ``error:`` line when the config breaks an invariant)."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(reference(), USAGE, ALIASES, GROUPS, CONFIG_DIR))
        return 0
    measure_rates = True
    if any(a.startswith("measure=") for a in argv):
        value = [a for a in argv if a.startswith("measure=")][-1].split("=", 1)[1]  # the last wins, as for keys
        if value not in ("true", "false"):
            raise ConfigError(f"measure={value!r} is not allowed; allowed: true, false")
        measure_rates, argv = value == "true", [a for a in argv if not a.startswith("measure=")]
    cfg, _ = compose_config(argv)
    prepare_process()  # before its parts are built and its rates measured, as in a training process
    plan = make_plan(cfg)
    print("\n".join(describe(plan)))
    if measure_rates:
        from offpolicy.tools.rates import measure

        rates = measure(cfg, backends=available_backends(cfg)).as_dict()
        timing = predict(plan, rates)
        print("\n".join(describe_timing(plan, rates, timing)))
        plan.update(rates=rates, timing=timing)
    print(json.dumps(plan))
    return 0


def available_backends(cfg: DictConfig) -> tuple[str, ...]:
    """The env backends that can step this run's env here (the env-step table measures each)."""
    from omegaconf import OmegaConf

    from offpolicy.config import check_env_backend
    from shared.env_backends import ENV_BACKENDS

    usable = []
    for backend in ENV_BACKENDS:
        try:
            check_env_backend(OmegaConf.merge(cfg, {"env": {"backend": backend}}))
        except ConfigError:
            continue
        usable.append(backend)
    return tuple(usable)

if __name__ == "__main__":
    run_cli(main)
