"""What prioritized replay costs (a figure, not a test): sample calls and priority updates per second of a
TensorDictReplayBuffer holding 1,000,000 HalfCheetah-sized transitions (observation 17, action 6, reward, done, next
observation), batch 256, with offpolicy.replay.prioritized.TorchPrioritizedSampler (torchrl's PrioritizedSampler on
pure-torch segment trees; alpha 0.6, beta 0.4, random priorities) and, for comparison, torchrl's uniform
RandomSampler (whose update_tensordict_priority returns at once: it is not a PrioritizedSampler). Wall clock (time.perf_counter), one torch thread.

    nice -n 5 python benchmarks/offpolicy_prioritized_replay.py [capacity=1000000]

Prints JSON lines and appends them to benchmarks/results/offpolicy_prioritized_replay.jsonl.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer  # noqa: E402

from offpolicy.replay.prioritized import TorchPrioritizedSampler  # noqa: E402

BATCH, CHUNK = 256, 100_000


def _transitions(n: int) -> TensorDict:
    done = torch.zeros(n, 1, dtype=torch.bool)
    return TensorDict({"observation": torch.randn(n, 17), "action": torch.rand(n, 6) * 2 - 1,
                       "next": {"observation": torch.randn(n, 17), "reward": torch.randn(n, 1), "done": done,
                                "terminated": done.clone()}}, [n])


def _rate(fn, seconds: float = 3.0, min_calls: int = 20) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after 5 warm-up calls)."""
    for _ in range(5):
        fn()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def measure(name: str, capacity: int) -> dict[str, tuple[float, str]]:
    sampler = (TorchPrioritizedSampler(capacity, alpha=0.6, beta=0.4) if name == "prioritized" else RandomSampler())
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=BATCH)
    chunk = _transitions(min(CHUNK, capacity))
    while len(rb) < capacity:
        rb.extend(chunk.clone())
    if name == "prioritized":  # spread priorities, as after training has updated them
        rb.update_priority(torch.arange(capacity), torch.rand(capacity) * 10)
    sample = rb.sample()
    sample["td_error"] = torch.rand(BATCH)
    calls = _rate(rb.sample)
    return {"sample_calls": (calls, "calls/s"), "sampled_transitions": (calls * BATCH, "transitions/s"),
            "sampler_only_calls": (_rate(lambda: sampler.sample(rb.storage, BATCH)), "calls/s"),
            "priority_updates": (_rate(lambda: rb.update_tensordict_priority(sample)), "calls/s")}


def main(argv: list[str]) -> None:
    capacity = int(dict(a.split("=", 1) for a in argv if "=" in a).get("capacity", 1_000_000))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    results = ROOT / "benchmarks" / "results" / "offpolicy_prioritized_replay.jsonl"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    for name in ("prioritized", "uniform"):
        for metric, (value, unit) in measure(name, capacity).items():
            line = {"bench": "offpolicy_prioritized_replay", "metric": f"{metric}/{name}", "value": round(value, 1),
                    "unit": unit, "capacity": capacity, "batch": BATCH}
            print(json.dumps(line), flush=True)
            with results.open("a") as f:
                f.write(json.dumps({**line, "time": stamp}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
