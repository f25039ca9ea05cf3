"""The learner's replay calls: chunks of batches per call, and a Ray rank's overlapped calls (the next chunk drawn in
a background thread while the current one is learned on) giving the same batches, in the same order, as calls in turn."""
from __future__ import annotations

import threading

import pytest
import torch
from offpolicy_helpers import smoke_parts

from offpolicy.learner import Learner, Sampling, make_learner


class _NumberedReplay:
    """Call ``k`` returns the ``k``-th run of ``n`` rows of ``batch`` (cycled), so every call draws something new;
    records the thread of each call."""

    def __init__(self, batch):
        self.batch, self.threads = batch, []

    def sample(self, n):
        k = len(self.threads)
        self.threads.append(threading.current_thread().name)
        return self.batch[(torch.arange(n) + k * n) % self.batch.numel()].clone()


def _one_round(overlap: bool):
    cfg, env, parts, batch = smoke_parts("dqn", "optim.batch_size=8")
    learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(8,), chunk=4,
                           overlap_sampling=overlap)
    replay, seen = _NumberedReplay(batch), []
    step = learner.step

    def recording_step(sample, version=None):
        seen.append(sample["observation"].clone())
        return step(sample, version)

    learner.step = recording_step
    learner.update(replay, 10, version=1)
    params = torch.cat([p.detach().reshape(-1) for p in parts.loss.parameters()])
    return replay.threads, seen, params


def test_overlapped_calls_draw_what_calls_in_turn_draw():
    threads_in_turn, seen_in_turn, params_in_turn = _one_round(overlap=False)
    threads_overlapped, seen_overlapped, params_overlapped = _one_round(overlap=True)
    # 10 steps in chunks of 4, 4 and 2: three calls either way, none beyond the round
    assert len(threads_in_turn) == len(threads_overlapped) == 3
    assert threads_in_turn == [threading.main_thread().name] * 3
    assert all(name.startswith("replay-sample") for name in threads_overlapped)
    assert len(seen_in_turn) == len(seen_overlapped) == 10
    for a, b in zip(seen_in_turn, seen_overlapped):
        assert torch.equal(a, b)
    assert torch.equal(params_in_turn, params_overlapped)  # the same batches in the same order: the same DQN update


def test_overlapped_calls_refuse_prioritized_replay():
    cfg, env, parts, _ = smoke_parts("dqn")
    with pytest.raises(ValueError, match="overlap_sampling needs uniform replay"):
        Learner(parts, Sampling((8,), prioritized=True, overlap=True))
