"""Each invariant is broken on purpose in an otherwise normal smoke run: the run must stop with a clear error, its
state at the break in broken.pt and last.pt left at the last whole round. Runs in-process (DQN on CartPole, the fastest algorithm) so the parts can be patched."""
from __future__ import annotations

import json

import pytest
import torch
from offpolicy_helpers import train_inprocess

from offpolicy import train
from offpolicy.builder import Builder
from offpolicy.collect.statistics import Rollout
from offpolicy.invariants import InvariantError, check_finite
from offpolicy.run import Run
from shared.config import run_cli

ARGS = ("algo=dqn", "profile=smoke", "eval.interval_env_steps=0", "eval.final_episodes=0")


def _run(tmp_path, *extra):
    """The run's summary; a broken one kept its state at the break in broken.pt, never in last.pt (no periodic
    checkpoint in these short runs, so none)."""
    s = train_inprocess(*ARGS, *extra, f"run_dir={tmp_path}")
    assert (tmp_path / "summary.json").exists()
    broken = s["status"] == "invariant_broken"
    assert (tmp_path / "checkpoints" / "last.pt").exists() is not broken
    assert (tmp_path / "checkpoints" / "broken.pt").exists() is broken
    assert s["broken_state"] == (str(tmp_path / "checkpoints" / "broken.pt") if broken else None)
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
    assert err[-1] == (f"error: invariant broken: replay received 99 transitions but 100 were collected; the state at "
                       f"the break: {tmp_path / 'checkpoints' / 'broken.pt'} (for inspection, not resumable); latest "
                       "checkpoint: None")


def test_a_broken_round_is_never_saved_as_the_checkpoint_that_resumes(tmp_path, monkeypatch, capsys):
    """NaN rewards from the third round on (the learner has stepped on them): last.pt stays the checkpoint of the
    last whole round (written every round here), which resumes to completion once the fault is gone; broken.pt holds
    the state at the break, and resuming it is one error line. (Before, the broken learner went into last.pt: 24 of
    31 tensors NaN, learner steps ahead of the counters, and it did not resume.)"""
    from torchrl.envs import Transform

    class NanFromRound3(Transform):
        def __init__(self):
            super().__init__(in_keys=["reward"], out_keys=["reward"])
            self.steps = 0

        def _apply_transform(self, reward):
            self.steps += 1
            return reward * float("nan") if self.steps > 200 else reward

    real = Builder.train_env

    def make(builder, obs_norm=None, **kwargs):
        env = real(builder, obs_norm, **kwargs)
        env.append_transform(NanFromRound3())
        return env

    monkeypatch.setattr(Builder, "train_env", make)
    monkeypatch.setattr(Run, "checkpoint_if_due", Run.save_checkpoint)  # a periodic checkpoint after every round
    s = train_inprocess(*ARGS, "collector.lean=false", "total_env_steps=400", f"run_dir={tmp_path}")
    assert s["status"] == "invariant_broken" and "non-finite metrics" in s["error"] and s["batches"] == 2
    assert s["checkpoint"] == str(tmp_path / "checkpoints" / "last.pt")
    kept = torch.load(s["checkpoint"], weights_only=True)
    assert kept["counters"]["batches"] == 2 and kept["learner"]["steps"] == kept["counters"]["optim_steps"] == 50
    assert all(torch.isfinite(v).all() for v in kept["learner"]["loss"].values() if v.is_floating_point())
    monkeypatch.undo()
    resumed = train_inprocess(f"resume={s['checkpoint']}", f"run_dir={tmp_path / 'resumed'}")
    # two more rounds: the replay (not in the checkpoint) refills the 200-step prefill, then one round of 50 steps
    assert resumed["status"] == "completed" and resumed["env_steps"] == 400 and resumed["optim_steps"] == 100
    with pytest.raises(SystemExit) as exit_:
        run_cli(train.main, [f"resume={tmp_path / 'checkpoints' / 'broken.pt'}"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith(f"error: resume='{tmp_path / 'checkpoints' / 'broken.pt'}' is "
                                                    "the state at a broken invariant (non-finite metrics")


# --- a defect: an exception that is neither the env's nor an engine's known failure ---------------------------------

def test_a_crash_writes_its_summary_keeps_the_last_whole_round_and_raises(tmp_path, monkeypatch, capsys):
    """The replay's sampler raises in the first round that learns: the exception still propagates with its traceback
    (exit 1 on the command line), after summary.json says ``crashed`` with the error's first line, and the checkpoint
    it names is the last whole round's (written every round here), not the state in the middle of the crash."""
    def raising(sample):
        def sample_(*args, **kwargs):
            raise RuntimeError("sampler defect\nits second line")
        return sample_

    _patch_buffer(monkeypatch, "sample", raising)
    monkeypatch.setattr(Run, "checkpoint_if_due", Run.save_checkpoint)  # a periodic checkpoint after every round
    with pytest.raises(RuntimeError, match="sampler defect"):
        train.main([*ARGS, f"run_dir={tmp_path}"])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "crashed" and s["error"] == "RuntimeError: sampler defect"
    assert s["checkpoint"] == str(tmp_path / "checkpoints" / "last.pt") and s["broken_state"] is None
    kept = torch.load(s["checkpoint"], weights_only=True)
    assert kept["counters"]["batches"] == s["batches"] >= 1 and kept["counters"]["optim_steps"] == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: crashed: RuntimeError: sampler defect; summary: {tmp_path / 'summary.json'}; latest checkpoint: "
        f"{tmp_path / 'checkpoints' / 'last.pt'}")


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
