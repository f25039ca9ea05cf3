"""Subnormals flushed in the learner's arithmetic (shared/denormals.py): every intra-op thread of a fresh learner
process flushes, the main thread only inside the learner's updates."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from shared import denormals

SMALLEST = 1  # the bits of float32's smallest subnormal, 1.4e-45


def _subnormals(n: int) -> torch.Tensor:
    return torch.full((n,), SMALLEST, dtype=torch.int32).view(torch.float32)


def test_a_fresh_process_starts_every_intra_op_thread_flushing():
    """What ``python -m offpolicy.train`` does first: torch's threads start flushing and keep it (POSIX threads
    inherit the floating-point environment; if a torch upgrade started them earlier, this fails by name); the main
    thread flushes only inside ``flushing()``, so envs and evaluations compute as anywhere else."""
    code = textwrap.dedent("""
        import torch
        from shared import denormals
        n = denormals.GRAIN * 2 * 4
        denormals.start_intra_op_threads(2)
        x = torch.ones(n, dtype=torch.int32).view(torch.float32)
        print(float(((x * 1.0) == 0).float().mean()))  # main thread off: its chunk keeps the subnormals
        with denormals.flushing():
            print(float(((x * 1.0) == 0).float().mean()), float((torch.full((512, 512), 1, dtype=torch.int32)
                  .view(torch.float32) @ torch.eye(512)).abs().max()))
        print(denormals.every_thread_flushes())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent)).stdout.split()
    assert 0.0 < float(out[0]) < 1.0  # the worker's half flushed, the main thread's not
    assert float(out[1]) == 1.0 and float(out[2]) == 0.0  # elementwise and MKL's matmul: every thread flushes
    assert out[3] == "True"


def test_flushing_is_on_inside_and_off_after():
    torch.set_num_threads(1)
    x = _subnormals(8)
    with denormals.flushing():
        assert bool(((x * 1.0) == 0).all())
    assert bool(((x * 1.0) != 0).all())


def test_the_learner_updates_inside_flushing(monkeypatch):
    from offpolicy_helpers import smoke_parts

    from offpolicy.learner import make_learner
    from offpolicy.replay import make_replay_buffer

    cfg, env, parts, batch = smoke_parts("td3")
    replay = make_replay_buffer(cfg)
    replay.extend(batch)
    learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(cfg.optim.batch_size,),
                           compiled=False)
    seen, step = [], learner.step
    x = _subnormals(8)

    def recording_step(*args, **kwargs):
        seen.append(bool(((x * 1.0) == 0).all()))
        return step(*args, **kwargs)

    monkeypatch.setattr(learner, "step", recording_step)
    torch.set_num_threads(1)
    learner.update(replay, 3, version=10)
    assert seen == [True, True, True]
    assert bool(((x * 1.0) != 0).all())  # off again after the round
