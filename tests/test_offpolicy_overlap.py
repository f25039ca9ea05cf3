"""``collector.overlap``: the lean collector in a child process, one batch ahead of the learner
(offpolicy/overlap.py). The hand-over gives one round of policy lag and no more, the same batches on a second run, a
dead child ends the run with one line, and the settings it cannot serve are refused."""
from __future__ import annotations

import copy
import os
import signal
import time

import pytest
import torch
from offpolicy_helpers import train_inprocess

from offpolicy.builder import Builder
from offpolicy.config import compose_config
from offpolicy.envs import make_train_env, obs_norm_state
from offpolicy.overlap import BackgroundCollector, CollectorLost
from shared.config import ConfigError


def _collector(seed=5, greedy=False):
    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", "collector.env_steps_per_batch=50",
                             "collector.overlap=true"])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    if greedy:  # epsilon 0 (it travels with the weights): the actions show which weights acted
        parts.exploration.eps.fill_(0.0)
    collector = BackgroundCollector(cfg, parts.collect_policy, seed, obs_norm_state(env))
    env.close()
    return parts, collector


def test_batch_k_is_collected_with_the_policy_published_before_round_k_minus_1():
    """Orders carry the weights of their moment: batches 0 and 1 act with version 0, batch 2 with version 1 (the
    weights as they were when round 1 began, not as the learner changed them afterwards), batch 3 with version 2."""
    parts, collector = _collector(greedy=True)
    network = parts.collect_policy[0].module[0].module
    try:
        batches = iter(collector)
        first = next(batches)  # orders batch 1 with version 0
        collector.update_policy_weights_()  # round 0 published
        second = next(batches)  # orders batch 2 with the live weights, version 1
        before = copy.deepcopy(network)
        with torch.no_grad():  # the learner moves on during round 1: the greedy actions flip
            network[-1].weight.neg_()
            network[-1].bias.neg_()
        collector.update_policy_weights_()
        third = next(batches)  # orders batch 3 with the flipped weights, version 2
        fourth = next(batches)
    finally:
        collector.shutdown()
    assert [int(b["next", "policy_version"].unique()) for b in (first, second, third, fourth)] == [0, 0, 1, 2]
    assert not collector.process.is_alive()

    def greedy(net, batch):
        with torch.no_grad():
            return net(batch["observation"][0]).argmax(-1)

    assert torch.equal(third["action"][0].argmax(-1), greedy(before, third))
    assert torch.equal(fourth["action"][0].argmax(-1), greedy(network, fourth))
    assert not torch.equal(greedy(before, fourth), greedy(network, fourth))  # the two weight sets act apart


def test_the_same_seed_collects_the_same_batches():
    collectors = [_collector(seed=11)[1] for _ in range(2)]  # the two children start side by side
    try:
        runs = [[next(c), next(c)] for c in collectors]
    finally:
        for c in collectors:
            c.shutdown()
    for a, b in zip(*runs):
        assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["action"], b["action"])


def test_a_dead_background_collector_is_noticed():
    _, collector = _collector()
    try:
        batches = iter(collector)
        next(batches)
        os.kill(collector.process.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(CollectorLost, match=r"died \(exit code -9\)"):
            next(batches)
            next(batches)  # the kill may land after the batch in flight was sent
        assert time.monotonic() - start < 10
    finally:
        collector.shutdown()


def test_an_overlapped_run_holds_every_invariant(tmp_path):
    """A whole run (every round's invariants, lag included, checked by the loop), then a resume: its first round
    carries the version it starts from."""
    s = train_inprocess("algo=dqn", "profile=smoke", "collector.overlap=true", f"run_dir={tmp_path / 'a'}")
    assert s["status"] == "completed" and s["error"] is None
    assert (s["env_steps"], s["batches"], s["optim_steps"], s["replay_writes"]) == (300, 3, 100, 300)
    resumed = train_inprocess(f"resume={tmp_path / 'a' / 'checkpoints' / 'last.pt'}", "total_env_steps=500",
                              f"run_dir={tmp_path / 'b'}")
    assert resumed["status"] == "completed" and resumed["batches"] == 5 and resumed["env_steps"] == 500


@pytest.mark.parametrize("overrides", [["collector.lean=false"], ["env=Pong"], ["engine=ray"]])
def test_settings_overlap_cannot_serve_are_refused(overrides):
    with pytest.raises(ConfigError, match=r"^collector\.overlap=true is not allowed"):
        compose_config(["algo=dqn", "collector.overlap=true", *overrides])


def test_a_dead_child_ends_the_run_with_its_error_and_a_checkpoint(tmp_path, monkeypatch):
    """The child killed after two batches: the run stops with status failed, the collector's error in the summary
    (train.py exits with code 4 and prints it as one ``error:`` line), and a checkpoint at the last round."""
    original = BackgroundCollector.__next__
    served = []

    def next_then_kill(self):
        if len(served) == 2:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.join()
        served.append(1)
        return original(self)

    monkeypatch.setattr(BackgroundCollector, "__next__", next_then_kill)
    s = train_inprocess("algo=dqn", "profile=smoke", "collector.overlap=true", f"run_dir={tmp_path}")
    assert s["status"] == "failed" and s["batches"] == 2
    assert s["error"] == "the background collector process died (exit code -9)"
    assert (tmp_path / "checkpoints" / "last.pt").exists()


def test_a_failing_child_reports_its_error():
    """A child that cannot build its collector (observation statistics of the wrong size) sends its error back."""
    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", "collector.overlap=true",
                             "env.obs_norm=true"])
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    env.close()
    collector = BackgroundCollector(cfg, parts.collect_policy, 0, {"loc": torch.zeros(7), "scale": torch.ones(7)})
    try:
        with pytest.raises(CollectorLost, match=r"^the background collector failed: \w+Error"):
            next(iter(collector))
    finally:
        collector.shutdown()
