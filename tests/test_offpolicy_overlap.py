"""``collector.overlap``: the lean collector in a child process, one batch ahead of the learner
(offpolicy/collect/overlap.py). The hand-over gives one round of policy lag and no more, the same batches on a second
run, a dead or silent child ends the run with one line, and the settings it cannot serve are refused."""
from __future__ import annotations

import copy
import os
import re
import signal
import time

import pytest
import torch
from offpolicy_helpers import train_inprocess

from offpolicy.builder import Builder
from offpolicy.collect.overlap import BackgroundCollector, CollectorLost
from offpolicy.config import compose_config
from offpolicy.envs import make_train_env, obs_norm_state
from shared.config import ConfigError


CARTPOLE = ["env=CartPole-v1", "collector.env_steps_per_batch=50"]
# ALE Pong through torchrl's Collector in the child: 2 envs, 25 steps each a batch, each frame stored once
PONG = ["env=Pong", "env.num_envs=2", "collector.env_steps_per_batch=50", "replay.frames_once=true",
        "replay.size=400", "collector.prefill_env_steps=100"]


def _collector(seed=5, greedy=False, env=CARTPOLE):
    cfg, _ = compose_config(["algo=dqn", "profile=smoke", *env, "collector.overlap=true"])
    torch.manual_seed(0)
    env = make_train_env(cfg)
    builder = Builder(cfg)
    parts = builder.parts(env)
    if greedy:  # epsilon 0 (it travels with the weights): the actions show which weights acted
        parts.exploration.eps.fill_(0.0)
    collector = BackgroundCollector(builder, parts.collect_policy, seed, obs_norm_state(env))
    env.close()
    return parts, collector


def _q_network(parts):
    return parts.collect_policy[0].module[0].module


def _greedy(network, batch):
    with torch.no_grad():
        return network(batch["observation"][0]).argmax(-1)


@pytest.mark.parametrize("env", [CARTPOLE, PONG], ids=["lean-cartpole", "atari-pong"])
def test_batch_k_is_collected_with_the_policy_published_before_round_k_minus_1(env):
    """Orders carry the weights of their moment: batches 0 and 1 act with version 0, batch 2 with version 1 (the
    weights as they were when round 1 began, not as the learner changed them afterwards), batch 3 with version 2.
    The same for the lean collector and for torchrl's Collector on ALE frames."""
    parts, collector = _collector(greedy=True, env=env)
    network = _q_network(parts)
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
    assert torch.equal(third["action"][0].argmax(-1), _greedy(before, third))
    assert torch.equal(fourth["action"][0].argmax(-1), _greedy(network, fourth))
    assert not torch.equal(_greedy(before, fourth), _greedy(network, fourth))  # the two weight sets act apart


def test_the_same_seed_collects_the_same_batches_with_the_weights_sent():
    """Two runs from the same seed, each sending the same new weights during the run (the greedy actions flipped,
    exploration off): the same batches, exploring ones included, and the batch ordered after the new weights acts
    with them."""
    runs = [_collector(seed=11) for _ in range(2)]  # the two children start side by side
    try:
        collected = []
        for parts, collector in runs:
            network = _q_network(parts)
            batches = [next(collector)]  # exploring with the initial weights; orders batch 1 with them
            with torch.no_grad():
                network[-1].weight.neg_()
                network[-1].bias.neg_()
            parts.exploration.eps.fill_(0.0)
            collector.update_policy_weights_()
            batches += [next(collector), next(collector)]  # batch 2 ordered with the new weights, version 1
            collected.append(batches)
    finally:
        for _, collector in runs:
            collector.shutdown()
    for a, b in zip(*collected):
        for key in ("observation", "action", ("next", "policy_version")):
            assert torch.equal(a[key], b[key]), key
    _, second, third = collected[0]
    assert [int(b["next", "policy_version"].unique()) for b in collected[0]] == [0, 0, 1]
    network = _q_network(runs[0][0])
    assert torch.equal(third["action"][0].argmax(-1), _greedy(network, third))
    assert not torch.equal(second["action"][0].argmax(-1), _greedy(network, second))


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


def test_a_silent_background_collector_is_stopped():
    """A child alive but sending nothing (stopped before its first order, so no batch is half sent) ends the wait
    once its batch is ``timeout_s`` late, with one line naming the child and its silence, and is ended."""
    _, collector = _collector()
    try:
        collector.timeout_s = 0.5
        os.kill(collector.process.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(CollectorLost) as lost:
            next(iter(collector))
        assert time.monotonic() - start < 5
        assert re.fullmatch(rf"the background collector process \(offpolicy-collector, pid {collector.process.pid}\) "
                            r"sent no batch in \d+\.\d s of waiting for it \(collector\.overlap_timeout_s=0\.5\); "
                            r"stopped it", str(lost.value)), lost.value
        assert float(str(lost.value).split(" batch in ")[1].split(" s ")[0]) >= 0.5
        assert collector.process.exitcode == -signal.SIGKILL
    finally:
        collector.shutdown()


def test_the_learner_s_own_time_is_not_the_child_s_silence():
    """The silence a timeout ends counts from when this process starts waiting: a round of learning longer than the
    timeout between an order and its wait (a long compile, a high UTD) finds the batch waiting, not a stopped child.
    Before, the silence counted from the order, and a healthy child was stopped."""
    _, collector = _collector()
    try:
        batches = iter(collector)
        next(batches)  # the child is up; batch 1 is ordered now
        collector.timeout_s = 1.0
        time.sleep(2.5)  # this process "learns" for 2.5 timeouts
        assert next(batches).numel() == 50 and collector.process.is_alive()
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


def test_an_overlapped_atari_run_holds_every_invariant(tmp_path):
    """DQN on Pong with each frame stored once, collected one batch ahead in a child: every round's invariants (the
    lag of one version included) hold, and every transition reaches the frame replay."""
    s = train_inprocess("algo=dqn", "profile=smoke", *PONG, "total_env_steps=300", "eval.interval_env_steps=0",
                        "eval.final_episodes=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["error"] is None
    assert (s["env_steps"], s["batches"], s["replay_writes"], s["policy_version"]) == (300, 6, 300, 6)


@pytest.mark.parametrize("overrides", [["collector.lean=false"], ["env.num_envs=2", "env.vector=process"],
                                       ["engine=ray"]])
def test_settings_overlap_cannot_serve_are_refused(overrides):
    with pytest.raises(ConfigError, match=r"^collector\.overlap=true is not allowed"):
        compose_config(["algo=dqn", "collector.overlap=true", *overrides])


@pytest.mark.parametrize("signum, error", [
    (signal.SIGKILL, r"the background collector process died \(exit code -9\)"),
    (signal.SIGSTOP, r"the background collector process \(offpolicy-collector, pid \d+\) sent no batch in \d+\.\d s "
                     r"of waiting for it \(collector\.overlap_timeout_s=0\.5\); stopped it"),
], ids=["killed", "stopped"])
def test_a_lost_child_ends_the_run_with_its_error_and_a_checkpoint(tmp_path, monkeypatch, signum, error):
    """The child killed, or stopped (alive but silent), as its third batch is ordered (the two before are back):
    the run stops with status failed, the collector's error in the summary (train.py exits with code 4 and prints it
    as one ``error:`` line), and a checkpoint at the last round; no child is left."""
    original = BackgroundCollector._order
    children = []

    def order_after_signal(self):
        children.append(self.process)
        if len(children) == 3:
            self.timeout_s = 0.5  # the child has started: a batch of the smoke profile takes milliseconds
            os.kill(self.process.pid, signum)
        original(self)

    monkeypatch.setattr(BackgroundCollector, "_order", order_after_signal)
    s = train_inprocess("algo=dqn", "profile=smoke", "collector.overlap=true", f"run_dir={tmp_path}")
    assert s["status"] == "failed" and s["batches"] == 2
    assert re.fullmatch(error, s["error"]), s["error"]
    assert (tmp_path / "checkpoints" / "last.pt").exists()
    assert not children[-1].is_alive()


def test_a_failing_child_reports_its_error():
    """A child that cannot build its collector (observation statistics of the wrong size) sends its error back."""
    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", "collector.overlap=true",
                             "env.obs_norm=true"])
    env = make_train_env(cfg)
    builder = Builder(cfg)
    parts = builder.parts(env)
    env.close()
    collector = BackgroundCollector(builder, parts.collect_policy, 0, {"loc": torch.zeros(7), "scale": torch.ones(7)})
    try:
        with pytest.raises(CollectorLost, match=r"^the background collector failed: \w+Error"):
            next(iter(collector))
    finally:
        collector.shutdown()
