"""Where the time of one off-policy iteration goes (a figure, not a test): CPU milliseconds per replay sample, loss
forward, backward, optimiser step and target update at batch 256 with 256x256 MLPs, plus one collection step
(policy + env), for each algorithm, built by the same builders as a training run.

    nice -n 5 python benchmarks/offpolicy_update_cost.py [algo ...]

Prints JSON lines and appends them to benchmarks/results/offpolicy_update_cost.jsonl.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from offpolicy import engine  # noqa: E402
from offpolicy.algorithms import build_parts  # noqa: E402
from offpolicy.train import compose_config  # noqa: E402

ENVS = {"sac": "HalfCheetah-v5", "td3": "HalfCheetah-v5", "ddpg": "HalfCheetah-v5", "dqn": "CartPole-v1"}


def _timed(fn, n: int) -> float:
    """CPU milliseconds per call (process time: robust to other jobs on the machine; one torch thread)."""
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1000


def measure(algo: str, n: int = 200) -> dict[str, float]:
    cfg, _ = compose_config([f"algo={algo}", f"env={ENVS[algo]}", "optim.batch_size=256", "model.hidden=[256,256]",
                             "collector.frames_per_batch=1000", "collector.prefill_frames=1000"])
    torch.manual_seed(0)
    torch.set_num_threads(cfg.threads)
    env = engine.make_train_env(cfg)
    parts = build_parts(cfg, env)
    collector = engine.make_collector(cfg, env, parts.collect_policy)
    replay = engine.make_replay_buffer(cfg)
    try:
        t0 = time.process_time()
        batch = next(iter(collector))
        collect_ms = (time.process_time() - t0) / batch.numel() * 1000
        replay.extend(batch.reshape(-1))
        params = [p for opt in parts.optimizers.values() for g in opt.param_groups for p in g["params"]]
        out = {"collect_step": collect_ms, "sample": _timed(lambda: replay.sample(), n)}
        sample = replay.sample()
        out["loss_forward"] = _timed(lambda: parts.loss(sample), n)

        def forward_backward():
            losses = parts.loss(sample)
            sum(v for k, v in losses.items() if k.startswith("loss")).backward()

        out["backward"] = _timed(forward_backward, n) - out["loss_forward"]
        opts = list(parts.optimizers.values())
        out["optimizer_step"] = _timed(lambda: [o.step() for o in opts], n)
        out["target_update"] = _timed(parts.target_updater.step, n)
        out["params"] = float(sum(p.numel() for p in params))
    finally:
        collector.shutdown()
    return out


def main(argv: list[str]) -> None:
    algos = [a for a in argv if "=" not in a] or list(ENVS)
    results = ROOT / "benchmarks" / "results" / "offpolicy_update_cost.jsonl"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    for algo in algos:
        for part, value in measure(algo).items():
            line = {"bench": f"offpolicy_update_cost/{algo}", "metric": part, "value": round(value, 3),
                    "unit": "count" if part == "params" else "ms"}
            print(json.dumps(line), flush=True)
            with results.open("a") as f:
                f.write(json.dumps({**line, "time": stamp}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
