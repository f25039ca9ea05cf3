"""The Nature-CNN DQN update on CPU (a figure, not a test): one learner step at batch 32 (replay sample, loss forward,
backward, Adam, hard-target bookkeeping), as ``profile=atari`` trains on Pong, in five builds of the same network:

    eager          float32, NCHW convolutions, fused Adam
    channels_last  float32, channels-last convolutions (weights and input), fused Adam
    compiled       float32, channels-last under the learner's torch.compile (``compile.enabled=true``), foreach Adam
    bf16           ``dqn.conv_precision=bfloat16``: the CNN under bfloat16 autocast (NCHW), eager
    compiled_bf16  the same under the learner's torch.compile (``profile=atari``'s 1M-step run on a CPU with
                   AVX512-BF16 or AMX: ``compile.enabled=auto`` and ``dqn.conv_precision=auto`` pick it)

with the FLOPs of one update (torch.utils.flop_counter, double DQN: online on s with backward, online and target on
s'), the achieved
GFLOP/s and, as the roofline, the GFLOP/s of one large float32 matmul on the same threads (the bf16 builds can pass it). The builds are measured
in alternated rounds and medians are printed (``rounds=3``).

    python benchmarks/atari_dqn_update_cost.py [threads=2] [rounds=3] [steps=100]

Prints JSON lines and appends them to benchmarks/results/atari_dqn_update_cost.jsonl.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from offpolicy import prepare_process  # noqa: E402
from offpolicy.learner import make_learner  # noqa: E402
from offpolicy.config import compose_config  # noqa: E402
from offpolicy.builder import Builder  # noqa: E402
from offpolicy.envs import make_train_env  # noqa: E402
from offpolicy.collect.statistics import for_replay  # noqa: E402
from offpolicy.replay import make_replay_buffer  # noqa: E402

BUILDS = {  # name: (dqn.conv_precision, channels-last float32 layout, compiled)
    "eager": ("float32", False, False), "channels_last": ("float32", True, False), "compiled": ("float32", True, True),
    "bf16": ("bfloat16", False, False), "compiled_bf16": ("bfloat16", False, True),
}
BASE = ["algo=dqn", "profile=atari", "env=Pong", "env.num_envs=10", "collector.env_steps_per_batch=1000"]


def _set_layout(parts, channels_last: bool) -> None:
    """Switch the Q network (and its target copy) between NCHW and channels-last convolutions."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for trunk in [m for m in parts.loss.modules() if hasattr(m, "channels_last")]:
        trunk.channels_last = channels_last
    with torch.no_grad():
        for params in (parts.loss.value_network_params, parts.loss.target_value_network_params):
            for p in params.values(True, True):
                if p.dim() == 4:
                    p.data = p.data.contiguous(memory_format=fmt)


def _learner(env, precision: str, channels_last: bool, compiled: bool):
    cfg, _ = compose_config([*BASE, f"compile.enabled={str(compiled).lower()}", f"dqn.conv_precision={precision}"])
    torch.manual_seed(0)
    parts = Builder(cfg).parts(env)
    _set_layout(parts, channels_last)
    return parts, make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(cfg.optim.batch_size,))


def update_flops(parts, sample) -> int:
    """FLOPs of one double-DQN update's network work (torch.utils.flop_counter on the plain Q network): forward and
    backward on the observations, forwards of the online and the target network on the next observations (Adam's
    elementwise work and the loss's gathers are left out)."""
    from torch.utils.flop_counter import FlopCounterMode

    net = parts.eval_policy.module[0].module  # QValueActor -> its Q network
    obs, next_obs = sample["observation"], sample["next", "observation"]
    with FlopCounterMode(display=False) as counter:
        net(obs).sum().backward()
        with torch.no_grad():
            net(next_obs)  # double DQN: the online network picks the next action
            net(next_obs)  # the target network (same shapes) values it
    net.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def matmul_gflops(threads: int, n: int = 1024, reps: int = 20) -> float:
    """GFLOP/s of an n x n float32 matmul on ``threads`` threads: the machine's dense roofline for this work."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e9


def main(argv: list[str]) -> None:
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    threads, rounds, steps = int(options.get("threads", 2)), int(options.get("rounds", 3)), int(options.get("steps", 100))
    torch.set_num_threads(threads)
    cfg, _ = compose_config([*BASE, "dqn.conv_precision=float32"])
    env = make_train_env(cfg)
    parts0 = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts0.collect_policy)
    replay = make_replay_buffer(cfg)
    try:
        for _, batch in zip(range(2), collector):
            replay.extend(for_replay(batch))
    finally:
        collector.shutdown()
    learners = {build: _learner(env, *how) for build, how in BUILDS.items()}
    flops = update_flops(learners["eager"][0], replay.sample(cfg.optim.batch_size))
    for _, learner in learners.values():  # warm-up: the compiled build compiles here
        learner.update(replay, max(learner.warmup_steps, 5), version=1 << 30)
    times: dict[str, list[float]] = {b: [] for b in BUILDS}
    for _ in range(rounds):
        for build in BUILDS:
            learner = learners[build][1]
            start = time.perf_counter()
            learner.update(replay, steps, version=1 << 30)
            times[build].append((time.perf_counter() - start) / steps * 1000)
    roofline = matmul_gflops(threads)
    results = ROOT / "benchmarks" / "results" / "atari_dqn_update_cost.jsonl"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    eager_ms = statistics.median(times["eager"])
    for build in BUILDS:
        ms = statistics.median(times[build])
        line = {"bench": "atari_dqn_update_cost", "build": build, "precision": BUILDS[build][0], "threads": threads,
                "batch": cfg.optim.batch_size,
                "step_ms_median": round(ms, 2), "step_ms_range": [round(min(times[build]), 2),
                                                                  round(max(times[build]), 2)],
                "update_gflop": round(flops / 1e9, 3), "gflops_per_s": round(flops / ms / 1e6, 1),
                "matmul_roofline_gflops_per_s": round(roofline, 1),
                "fraction_of_roofline": round(flops / ms / 1e6 / roofline, 3),
                "speedup_vs_eager": round(eager_ms / ms, 3),
                "recompiles": learners[build][1].recompiles}
        print(json.dumps(line), flush=True)
        with results.open("a") as f:
            f.write(json.dumps({**line, "time": stamp}) + "\n")


if __name__ == "__main__":
    prepare_process()  # as every process that runs the engine's code
    main(sys.argv[1:])
