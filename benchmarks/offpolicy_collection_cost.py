"""Where the time of local collection goes (a figure, not a test): CPU microseconds per env step (per transition) at
env.num_envs = 1, 8 and 64, for DQN's collection policy on CartPole-v1 and SAC's on HalfCheetah-v5, built the way the
local engine builds them (offpolicy/engines/local.py), with one torch thread:

    raw_env        the Gymnasium env itself: N ``gymnasium.make`` copies stepped in a loop with presampled random
                   actions (reset when an episode ends): what no wrapper can go below
    guarded_env    the same copies made by ``make_gym``, inside the fault guard every collector steps
                   (shared/env_guard.py: exceptions and non-finite observations or rewards become an EnvFault)
    guard          guarded_env - raw_env: what the guard costs per env step
    torchrl_env    the training env (make_train_env: a GymEnv, or a SerialEnv of N; DoubleToFloat, RewardSum,
                   StepCounter, InitTracker) stepped alone: a presampled random action set into the TensorDict, then
                   ``step_and_maybe_reset`` (step, step_mdp, resets)
    policy         the collection policy's forward on the env's batch of N observations (no_grad, RANDOM exploration;
                   DQN's epsilon annealed to its end value first, as for most of a run)
    tensor_policy  what the lean collector calls instead, under inference mode, where the policy offers it: DQN's
                   one batch of epsilon-greedy draws ahead and ``act_index`` per step on the plain observation
                   tensor (integer actions); SAC's ``act`` on the plain observation tensor
    collector      one whole torchrl ``Collector`` batch (``next(iter(collector))``, 1024 env steps, with
                   ``collector.lean=false``) over its env steps
    overhead       collector - torchrl_env - policy: the Collector's own work (carrier updates, policy version,
                   traj ids, stacking the batch)
    raw_env_fraction  raw_env / collector: the share of collection that is the simulator
    lean_collector one batch of the engine's lean collector (offpolicy/collect/lean.py, the default where it applies:
                   the Gymnasium copies stepped in a loop with numpy, the policy's plain-tensor ``act`` where it
                   has one, one TensorDict per batch) over its env steps
    lean_overhead  lean_collector - guarded_env - (tensor_policy, else policy): what is neither the (guarded)
                   simulator nor the policy
    lean_raw_env_fraction  raw_env / lean_collector
    lean_speedup   collector / lean_collector
    replay_extend  ``for_replay`` + ``replay.extend`` of a collected batch
    rollout_stats  ``RolloutStats``: ``stats(batch); stats.drain()``

    nice -n 5 python benchmarks/offpolicy_collection_cost.py [dqn] [sac] [num_envs=1,8,64] [out=PATH]

CPU time (time.process_time, all threads of this process), so other jobs on the machine inflate it less than wall
time; each figure is the median of 5 timings of at least 0.1 s (and one call) each, after one warm-up call, so a burst
of other work moves it little. Prints JSON lines and appends them to ``out`` (default
benchmarks/results/offpolicy_collection_cost.jsonl).
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import gymnasium  # noqa: E402
import torch  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402

from offpolicy import prepare_process  # noqa: E402
from offpolicy.algos.base import ActsOnTensors, DrawsAhead, anneal  # noqa: E402
from offpolicy.builder import Builder  # noqa: E402
from offpolicy.collect.statistics import RolloutStats, for_replay  # noqa: E402
from offpolicy.config import compose_config  # noqa: E402
from offpolicy.envs import make_train_env  # noqa: E402
from offpolicy.replay import make_replay_buffer  # noqa: E402
from shared.env_guard import make_gym  # noqa: E402

CASES = {"dqn": "CartPole-v1", "sac": "HalfCheetah-v5"}
BATCH = 1024  # collector.env_steps_per_batch: a multiple of every num_envs


def _us_per_step(fn, steps: int, repeats: int = 5, min_s: float = 0.1) -> float:
    """CPU microseconds per env step of ``fn()``, which does ``steps`` env steps: after one warm-up call, the median
    of ``repeats`` timings of at least ``min_s`` (and one call) each."""
    fn()
    per_call = []
    for _ in range(repeats):
        calls, start = 0, time.process_time()
        while calls < 1 or time.process_time() - start < min_s:
            fn()
            calls += 1
        per_call.append((time.process_time() - start) / calls)
    return statistics.median(per_call) / steps * 1e6


def _raw_env(name: str, n: int, make=gymnasium.make):
    """One call steps N Gymnasium copies made by ``make`` once each."""
    envs = [make(name) for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        env.action_space.seed(i)
    actions = [envs[0].action_space.sample() for _ in range(64)]
    count = 0

    def step():
        nonlocal count
        for env in envs:
            _, _, terminated, truncated, _ = env.step(actions[count % len(actions)])
            count += 1
            if terminated or truncated:
                env.reset()
    return step


def _per_batch(collector) -> tuple[float, object]:
    """CPU microseconds per env step of the collector's batches, and its last batch."""
    batches, last = iter(collector), {}

    def collect():
        last["batch"] = next(batches)
    return _us_per_step(collect, BATCH), last["batch"]


def measure(algo: str, n: int) -> dict[str, float]:
    overrides = [f"algo={algo}", f"env={CASES[algo]}", f"env.num_envs={n}", "replay.size=100000",
                 f"collector.env_steps_per_batch={BATCH}"]
    cfg, _ = compose_config([*overrides, "collector.lean=false"])
    torch.manual_seed(0)
    torch.set_num_threads(1)  # again each case: closing a SerialEnv raises torch's threads by its env count
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    if parts.exploration is not None:  # epsilon at its end value, as for most of a run (at 1 every step explores)
        anneal(parts.exploration, 10**12)
    out = {"raw_env": _us_per_step(_raw_env(CASES[algo], n), n)}
    out["guarded_env"] = _us_per_step(_raw_env(CASES[algo], n, make=make_gym), n)
    out["guard"] = out["guarded_env"] - out["raw_env"]

    td = env.reset()
    actions = [env.action_spec.rand() for _ in range(64)]
    count = 0

    def env_step():
        nonlocal td, count
        td.set("action", actions[count % len(actions)])
        count += 1
        _, td = env.step_and_maybe_reset(td)
    out["torchrl_env"] = _us_per_step(env_step, n)

    obs = env.reset()
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        out["policy"] = _us_per_step(lambda: parts.collect_policy(obs), n)
    policy, observation = parts.collect_policy, obs["observation"]
    with torch.inference_mode(), set_exploration_type(ExplorationType.RANDOM):  # as the lean collector calls it
        if isinstance(policy, DrawsAhead):  # DQN: one batch's randomness drawn ahead (its cost counted), then per step
            def act_with_draws():
                draws = policy.draw(BATCH // n, n)
                for t in range(BATCH // n):
                    policy.act_index(observation, draws, t)
            out["tensor_policy"] = _us_per_step(act_with_draws, BATCH)
        elif isinstance(policy, ActsOnTensors):
            out["tensor_policy"] = _us_per_step(lambda: policy.act(observation), n)

    collector = Builder(cfg).collector(env, parts.collect_policy)  # appends its PolicyVersion transform to env
    out["collector"], batch = _per_batch(collector)
    out["overhead"] = out["collector"] - out["torchrl_env"] - out["policy"]
    out["raw_env_fraction"] = out["raw_env"] / out["collector"]
    lean_cfg, _ = compose_config([*overrides, "collector.lean=true"])
    lean = Builder(lean_cfg).collector(make_train_env(lean_cfg), parts.collect_policy)
    out["lean_collector"], _ = _per_batch(lean)
    lean.shutdown()
    out["lean_overhead"] = out["lean_collector"] - out["guarded_env"] - out.get("tensor_policy", out["policy"])
    out["lean_raw_env_fraction"] = out["raw_env"] / out["lean_collector"]
    out["lean_speedup"] = out["collector"] / out["lean_collector"]

    replay = make_replay_buffer(cfg)
    out["replay_extend"] = _us_per_step(lambda: replay.extend(for_replay(batch)), BATCH)
    flat, stats = for_replay(batch), RolloutStats()
    out["rollout_stats"] = _us_per_step(lambda: (stats(flat), stats.drain()), BATCH)
    collector.shutdown()  # closes env now, not in a garbage collection during the next case
    return out


def main(argv: list[str]) -> None:
    algos = [a for a in argv if "=" not in a] or list(CASES)
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = (set(options) - {"num_envs", "out"}) | (set(algos) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown {', '.join(sorted(unknown))}; usage: [dqn] [sac] [num_envs=1,8,64] [out=PATH]")
    sizes = [int(n) for n in options.get("num_envs", "1,8,64").split(",")]
    out = Path(options.get("out", ROOT / "benchmarks" / "results" / "offpolicy_collection_cost.jsonl"))
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": platform.node()}
    for algo in algos:
        for n in sizes:
            for metric, value in measure(algo, n).items():
                ratio = metric.endswith(("fraction", "speedup"))
                line = {"bench": f"offpolicy_collection_cost/{algo}-{CASES[algo]}", "num_envs": n, "metric": metric,
                        "value": round(value, 3 if ratio else 2), "unit": "x" if ratio else "us/step"}
                print(json.dumps(line), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps({**line, **meta}) + "\n")


if __name__ == "__main__":
    prepare_process()  # as every process that runs the engine's code
    main(sys.argv[1:])
