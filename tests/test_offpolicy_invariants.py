"""Each invariant is broken on purpose in an otherwise normal smoke run: the run must stop with a clear error and
a checkpoint. Runs in-process (DQN on CartPole, the fastest algorithm) so the parts can be patched."""
from __future__ import annotations

import pytest
from offpolicy_helpers import train_inprocess

from offpolicy import train
from offpolicy.builder import Builder
from offpolicy.collect.statistics import Rollout
from offpolicy.invariants import InvariantError, check_finite

ARGS = ("algo=dqn", "profile=smoke", "eval.interval_env_steps=0", "eval.final_episodes=0")


def _run(tmp_path, *extra):
    s = train_inprocess(*ARGS, *extra, f"run_dir={tmp_path}")
    assert (tmp_path / "checkpoints" / "last.pt").exists()
    assert (tmp_path / "summary.json").exists()
    return s


def _patch_buffer(monkeypatch, method, wrap):
    real = Builder.replay

    def make(builder, run_dir=None):
        rb = real(builder, run_dir)
        setattr(rb, method, wrap(getattr(rb, method)))
        return rb

    monkeypatch.setattr(Builder, "replay", make)


def test_unbroken_run_passes(tmp_path):
    s = _run(tmp_path)
    assert s["status"] == "completed" and s["error"] is None


def test_lost_transitions_stop_the_run(tmp_path, monkeypatch):
    _patch_buffer(monkeypatch, "extend", lambda extend: lambda data, *a, **k: extend(data[:-1], *a, **k))
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken"
    assert "replay received 99 transitions but 100 were collected" in s["error"]
    assert s["batches"] == 0  # stopped at the first batch


def test_wrong_sample_shape_stops_the_run(tmp_path, monkeypatch):
    # one transition short per replay call: the last batch of the learner's chunk comes out with 31
    _patch_buffer(monkeypatch, "sample", lambda sample: lambda *a, **k: sample(*a, **k)[:-1])
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken"
    assert "sampled batch has shape (31,); expected (32,)" in s["error"]


def test_missing_sample_key_stops_the_run(tmp_path, monkeypatch):
    _patch_buffer(monkeypatch, "sample", lambda sample: lambda *a, **k: sample(*a, **k).exclude(("next", "reward")))
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken" and "lacks keys" in s["error"] and "reward" in s["error"]


def test_unpublished_weights_stop_the_run(tmp_path, monkeypatch):
    real = Builder.collector

    def make(builder, env, policy, seed=None):
        collector = real(builder, env, policy, seed)
        collector.update_policy_weights_ = lambda *a, **k: None  # weights never reach the collector
        return collector

    monkeypatch.setattr(Builder, "collector", make)
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken"
    assert s["error"] == "collector policy_version 0 after 1 publications" and s["batches"] == 0


def test_future_policy_version_in_a_sample_stops_the_run(tmp_path, monkeypatch):
    def from_the_future(sample):
        def draw(*a, **k):
            batch = sample(*a, **k)
            batch["next", "policy_version"][0] = 99  # a transition of a policy the learner has not published
            return batch
        return draw

    _patch_buffer(monkeypatch, "sample", from_the_future)
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken"
    assert s["error"] == "sampled a transition of policy_version 99 on a learner at version 1"


def test_non_finite_metric_stops_the_run(tmp_path, monkeypatch):
    from torchrl.envs import RewardScaling

    real = Builder.train_env

    def make(builder, obs_norm=None, **kwargs):
        env = real(builder, obs_norm, **kwargs)
        env.append_transform(RewardScaling(loc=0.0, scale=float("nan")))  # every reward becomes NaN
        return env

    monkeypatch.setattr(Builder, "train_env", make)
    s = _run(tmp_path, "collector.lean=false")  # torchrl's Collector steps the patched env
    assert s["status"] == "invariant_broken" and "non-finite metrics" in s["error"]


def test_check_finite():
    check_finite({"a": 1.0, "b": -2})
    with pytest.raises(InvariantError, match="loss/x"):
        check_finite({"loss/x": float("inf")})


def test_cli_exit_code_on_broken_invariant(tmp_path, monkeypatch, capsys):
    _patch_buffer(monkeypatch, "extend", lambda extend: lambda data, *a, **k: extend(data[:-1], *a, **k))
    assert train.main([*ARGS, f"run_dir={tmp_path}"]) == train.EXIT_INVARIANT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: invariant broken: replay received 99")
    assert "checkpoint saved to" in err[-1]


# --- the per-round invariants on reports, as every engine makes them (here: two Ray collectors' rollouts) ------------

def _report(**changes):
    from offpolicy.report import RoundReport

    rollouts = changes.pop("rollouts", [Rollout(env_steps=200, version_lo=3, version_hi=3)] * 2)
    fields = {"index": 3, "rollout": Rollout.merge(rollouts), "replay_writes": 1400, "replay_size": 1400,
              "steps_asked": 50, "steps_done": 50, "learned": {}, "published": 4, "collect_s": 0.1, "learn_s": 0.1}
    return RoundReport(**{**fields, **changes})


@pytest.mark.parametrize("changes,message", [
    ({"replay_writes": 1399}, "replay received 399 transitions but 400 were collected"),
    ({"rollouts": [Rollout(env_steps=200, version_lo=3, version_hi=3), Rollout(env_steps=200, version_lo=2, version_hi=3)]},
     "batch 3 carries policy_version 2..3; expected 3"),
    ({"steps_done": 49}, "batch 3 ran 49 optimiser steps; expected 50"),
    ({"published": 3}, "collector policy_version 3 after 4 publications"),
])
def test_round_invariants(changes, message):
    from offpolicy.invariants import RoundInvariants

    RoundInvariants(writes_at_start=1000).check(_report())  # a consistent round passes
    with pytest.raises(InvariantError, match=message.replace(".", r"\.")):
        RoundInvariants(writes_at_start=1000).check(_report(**changes))
