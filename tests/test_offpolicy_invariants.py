"""Each invariant is broken on purpose in an otherwise normal smoke run: the run must stop with a clear error and
a checkpoint. Runs in-process (DQN on CartPole, the fastest algorithm) so the parts can be patched."""
from __future__ import annotations

import pytest
from offpolicy_helpers import train_inprocess

from offpolicy import engine, train
from offpolicy.invariants import InvariantError, check_finite

ARGS = ("algo=dqn", "profile=smoke", "eval.interval_frames=0", "eval.final_episodes=0")


def _run(tmp_path):
    s = train_inprocess(*ARGS, f"run_dir={tmp_path}")
    assert (tmp_path / "checkpoints" / "last.pt").exists()
    assert (tmp_path / "summary.json").exists()
    return s


def _patch_buffer(monkeypatch, method, wrap):
    real = engine.make_replay_buffer

    def make(cfg, run_dir=None):
        rb = real(cfg, run_dir)
        setattr(rb, method, wrap(getattr(rb, method)))
        return rb

    monkeypatch.setattr(engine, "make_replay_buffer", make)


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
    _patch_buffer(monkeypatch, "sample", lambda sample: lambda *a, **k: sample(*a, **k)[:-1])
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken"
    assert "sampled batch has shape (31,); expected (32,)" in s["error"]


def test_missing_sample_key_stops_the_run(tmp_path, monkeypatch):
    _patch_buffer(monkeypatch, "sample", lambda sample: lambda *a, **k: sample(*a, **k).exclude(("next", "reward")))
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken" and "lacks keys" in s["error"] and "reward" in s["error"]


def test_unpublished_weights_stop_the_run(tmp_path, monkeypatch):
    real = engine.make_collector

    def make(cfg, env, policy):
        collector = real(cfg, env, policy)
        collector.update_policy_weights_ = lambda *a, **k: None  # weights never reach the collector
        return collector

    monkeypatch.setattr(engine, "make_collector", make)
    s = _run(tmp_path)
    assert s["status"] == "invariant_broken"
    assert "policy_version" in s["error"]


def test_non_finite_metric_stops_the_run(tmp_path, monkeypatch):
    from torchrl.envs import RewardScaling

    real = engine.make_train_env

    def make(cfg, obs_norm_state=None):
        env = real(cfg, obs_norm_state)
        env.append_transform(RewardScaling(loc=0.0, scale=float("nan")))  # every reward becomes NaN
        return env

    monkeypatch.setattr(engine, "make_train_env", make)
    s = _run(tmp_path)
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
