"""The learner's torch threads (``threads``): ``auto``, the default, gives the learner every core it can have; a
number is kept; bad values are one error line."""
from __future__ import annotations

import os

import pytest
import torch
from offpolicy_helpers import run_cli, train_inprocess

from offpolicy.config import compose_config
from offpolicy.engines import engine_class


def _threads(*overrides: str) -> int:
    cfg, _ = compose_config(["algo=td3", *overrides])
    return engine_class(cfg.engine).learner_threads(cfg)


def test_the_default_is_auto():
    cfg, _ = compose_config(["algo=sac"])
    assert cfg.threads == "auto"


def test_auto_takes_every_core_the_learner_can_have(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert _threads() == 3
    assert _threads("collector.overlap=true") == 2  # the overlapped collector's child process has the third core
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's limit, as torch honours it
    assert _threads() == 1
    assert _threads("collector.overlap=true") == 1  # never below one
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # set but empty: the CPUs again
    assert _threads() == 3
    assert _threads("engine=ray", "ray.learner_cpus=3") == 3  # a rank has the CPUs Ray reserves for it
    assert _threads("engine=ray", "ray.learner_cpus=0.5") == 1
    assert _threads("threads=4") == 4 and _threads("threads=1", "collector.overlap=true") == 1  # a number is kept


def test_a_number_stays_a_number():
    """The default is the string ``auto``; a number on the command line stays an int (not coerced to "2")."""
    cfg, _ = compose_config(["algo=td3", "threads=2"])
    assert cfg.threads == 2 and type(cfg.threads) is int


@pytest.mark.parametrize("value", ["0", "many", "2.5", "true"])
def test_a_bad_threads_value_is_one_error_line(value, capsys):
    """The entry point in this process (its exit code and stderr as a shell sees them; one value also as a
    subprocess, as a user runs it)."""
    from offpolicy.train import main
    from shared.config import run_cli as run_entry_point

    shown = {"0": "0", "many": "'many'", "2.5": "2.5", "true": "True"}[value]
    expected = [f"error: threads={shown} is out of range; allowed: auto or an integer >= 1"]
    with pytest.raises(SystemExit) as exit_:
        run_entry_point(main, ["algo=td3", f"threads={value}"])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip().splitlines() == expected
    if value == "many":
        proc = run_cli("algo=td3", f"threads={value}")
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == expected


def test_a_run_learns_on_the_threads_auto_gives_and_says_so(monkeypatch, tmp_path, capsys):
    from offpolicy.learner import Learner

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    seen, update = [], Learner.update

    def recording_update(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return update(self, *args, **kwargs)

    monkeypatch.setattr(Learner, "update", recording_update)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        s = train_inprocess("algo=dqn", "env=CartPole-v1", "profile=smoke", "total_env_steps=300",
                            "eval.interval_env_steps=0", "eval.final_episodes=0", f"run_dir={tmp_path}")
    finally:
        torch.set_num_threads(before)
    assert s["status"] == "completed" and s["optim_steps"] > 0
    assert seen and set(seen) == {2}
    start_line = capsys.readouterr().out
    assert "planned optimiser steps < 25,000) on 2 torch threads (threads=auto), subnormals flushed" in start_line
