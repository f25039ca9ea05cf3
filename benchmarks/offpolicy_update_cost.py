"""Where the time of one off-policy iteration goes (a figure, not a test): CPU milliseconds per replay sample, loss
forward (and how much of it is matrix multiplies), backward, optimiser step and target update at batch 256 with
256x256 MLPs, plus one collection step (policy + env), for each algorithm, built by the same builders as a training
run; then one whole update (loss, backward, optimiser steps) in wall-clock ms, the engine's learner step (its
chunked samples, checks, clips and target update) and, beside it, benchmarks/offpolicy_reference.py's update of the
same algorithm on the same transitions (plain PyTorch; ``learner_to_reference``: above 1, the engine's step is
slower), eager and, with ``compile=true``, the learner step compiled (``compile.enabled=true``:
the learner's own compiled step, with its compile time and the recompilations after warm-up, which should be 0;
``skip_guards=false``: with every guard, ``compile.skip_guards=false``; the default keeps the tensor guards only).

    nice -n 5 python benchmarks/offpolicy_update_cost.py [algo ...] [threads=1] [compile=false] [deactivate_vmap=true]
                                                         [skip_guards=true] [mode=default]

``mode`` is the compiled learner's ``compile.mode`` (torch.compile's mode; ``default``: None).

Prints JSON lines and appends them to benchmarks/results/offpolicy_update_cost.jsonl.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # offpolicy_reference.py

import torch  # noqa: E402

from offpolicy import prepare_process  # noqa: E402
from offpolicy.algos import networks  # noqa: E402
from offpolicy.learner import make_learner  # noqa: E402
from offpolicy.config import compose_config  # noqa: E402
from offpolicy.builder import Builder  # noqa: E402
from offpolicy.envs import make_train_env  # noqa: E402
from offpolicy.replay import make_replay_buffer  # noqa: E402

ENVS = {"sac": "HalfCheetah-v5", "td3": "HalfCheetah-v5", "ddpg": "HalfCheetah-v5", "dqn": "CartPole-v1"}


def _timed(fn, n: int) -> float:
    """CPU milliseconds per call (process time: robust to other jobs on the machine; one torch thread)."""
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1000


def _matmul_ms(fn, n: int) -> float:
    """CPU ms per call spent in matrix-multiply kernels (the networks' arithmetic), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            fn()
    kernels = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm")
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in kernels) / 1000 / n


def _wall_ms(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1000


def _reference_update(algo: str, cfg, transitions):
    """benchmarks/offpolicy_reference.py's update (plain PyTorch, the CleanRL way) for the same algorithm, batch and
    networks, on a ring buffer holding the same transitions: the same work as one learner step, without the engine."""
    import gymnasium as gym

    import offpolicy_reference as reference

    env = gym.make(ENVS[algo])
    obs, next_obs = transitions["observation"], transitions["next", "observation"]
    action = transitions["action"]
    discrete = algo == "dqn"
    if discrete:
        action = action.argmax(-1)  # one-hot (torchrl) -> the index the reference stores
    rb = reference.Replay(len(obs), obs.shape[-1], tuple(action.shape[1:]), action.dtype)
    rb.obs.copy_(obs)
    rb.next_obs.copy_(next_obs)
    rb.action.copy_(action)
    rb.reward.copy_(transitions["next", "reward"].reshape(-1))
    rb.terminated.copy_(transitions["next", "terminated"].reshape(-1).float())
    rb.pos, rb.full = 0, True
    hidden = tuple(cfg.model.hidden)
    if discrete:
        _, update = reference.dqn(env, rb, cfg.optim.batch_size, hidden, utd=1.0)
    else:
        _, update = getattr(reference, algo)(env, rb, cfg.optim.batch_size, hidden)
    return update


def measure(algo: str, n: int = 200, threads: int = 1, compiled: bool = False,
            deactivate_vmap: bool = True, skip_guards: bool = True, mode: str = "default") -> dict[str, float]:
    overrides = [f"algo={algo}", f"env={ENVS[algo]}", "optim.batch_size=256", "model.hidden=[256,256]",
                 "collector.env_steps_per_batch=1000", "collector.prefill_env_steps=1000"]
    cfg, _ = compose_config(overrides)
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    networks.DEACTIVATE_VMAP = deactivate_vmap
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    replay = make_replay_buffer(cfg)
    try:
        t0 = time.process_time()
        batch = next(iter(collector))
        collect_ms = (time.process_time() - t0) / batch.numel() * 1000
        replay.extend(batch.reshape(-1))
        params = [p for opt in parts.optimizers.values() for g in opt.param_groups for p in g["params"]]
        batch_size = cfg.optim.batch_size
        out = {"collect_step": collect_ms, "sample": _timed(lambda: replay.sample(batch_size), n),
               "sample_chunked": _timed(lambda: replay.sample(batch_size * 32).split(batch_size), n // 8) / 32}
        sample = replay.sample(batch_size)
        out["loss_forward"] = _timed(lambda: parts.loss(sample), n)

        def forward_backward():
            losses = parts.loss(sample)
            sum(v for k, v in losses.items() if k.startswith("loss")).backward()

        out["backward"] = _timed(forward_backward, n) - out["loss_forward"]
        opts = list(parts.optimizers.values())
        out["optimizer_step"] = _timed(lambda: [o.step() for o in opts], n)
        out["target_update"] = _timed(parts.target_updater.step, n)
        out["params"] = float(sum(p.numel() for p in params))
        out["loss_forward_matmul"] = _matmul_ms(lambda: parts.loss(sample), 50)

        def update(batch):
            losses = parts.loss(batch)
            sum(v for k, v in losses.items() if k.startswith("loss")).backward()
            for o in opts:
                o.step()
                o.zero_grad()

        out["update_wall"] = _wall_ms(lambda: update(replay.sample(batch_size)), n)
        # the engine's whole round: chunked samples, checks, loss, backward, per-network clip + step, target update
        # eager: compile.enabled=auto would compile this learner (the case's full-length run is long enough)
        learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(batch_size,), compiled=False)
        out["learner_step_wall"] = _wall_ms(lambda: learner.update(replay, 50, version=1), max(n // 50, 2)) / 50
        out["reference_update_wall"] = _wall_ms(_reference_update(algo, cfg, batch.reshape(-1)), n)
        out["learner_to_reference"] = out["learner_step_wall"] / out["reference_update_wall"]
        if compiled:
            torch.compiler.reset()  # each algorithm compiles from scratch (the step functions share their code)
            compiled_cfg, _ = compose_config([*overrides, "compile.enabled=true", f"compile.mode={mode}",
                                              f"compile.skip_guards={str(skip_guards).lower()}"])
            torch.manual_seed(0)
            fast = make_learner(compiled_cfg, Builder(compiled_cfg).parts(env), env.action_spec_unbatched,
                                sample_shape=(batch_size,))
            t0 = time.perf_counter()
            fast.update(replay, fast.warmup_steps, version=1)
            out["compile_s"] = time.perf_counter() - t0
            out["learner_step_wall_compiled"] = _wall_ms(lambda: fast.update(replay, 50, version=1),
                                                         max(n // 50, 2)) / 50
            out["compile_recompiles"] = float(fast.recompiles)
            out["compiled_speedup"] = out["learner_step_wall"] / out["learner_step_wall_compiled"]
    finally:
        collector.shutdown()
    return out


def main(argv: list[str]) -> None:
    algos = [a for a in argv if "=" not in a] or list(ENVS)
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    threads, compiled = int(options.get("threads", 1)), options.get("compile", "false") == "true"
    no_vmap = options.get("deactivate_vmap", "true") == "true"  # the engine's setting (networks.DEACTIVATE_VMAP)
    skip_guards = options.get("skip_guards", "true") == "true"  # compile.skip_guards for the compiled learner
    mode = options.get("mode", "default")  # compile.mode for the compiled learner
    results = ROOT / "benchmarks" / "results" / "offpolicy_update_cost.jsonl"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    for algo in algos:
        for part, value in measure(algo, threads=threads, compiled=compiled, deactivate_vmap=no_vmap,
                                   skip_guards=skip_guards, mode=mode).items():
            unit = {"params": "count", "compile_s": "s", "compile_recompiles": "count", "compiled_speedup": "x",
                    "learner_to_reference": "x"}.get(part, "ms")
            line = {"bench": f"offpolicy_update_cost/{algo}", "metric": part, "value": round(value, 3),
                    "unit": unit, "threads": threads, "deactivate_vmap": no_vmap, "skip_guards": skip_guards,
                    "mode": mode}
            print(json.dumps(line), flush=True)
            with results.open("a") as f:
                f.write(json.dumps({**line, "time": stamp}) + "\n")


if __name__ == "__main__":
    prepare_process()  # as every process that runs the engine's code
    main(sys.argv[1:])
