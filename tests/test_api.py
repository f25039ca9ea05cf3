"""The Python API of both entry points: ``from offpolicy.api import train`` and ``from a3c.api import train`` are plain
functions, whatever was imported first; keyword overrides are the command line's words, checked the same way (a
bad one raises the ConfigError the CLI prints); a run returns its summary. (An off-policy run from Python: docs/usage.md's
example in tests/test_docs.py and the own-env runs in tests/test_own_envs.py.)"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from shared.config import ConfigError, overrides_argv, run_cli


def test_overrides_are_the_command_lines_words():
    assert overrides_argv({
        "algo": "sac", "env": "my_envs.drift:Drift-v0", "optim": {"lr": 1e-3, "max_grad_norm": None},
        "model.hidden": (64, 64), "eval.video": False, "run_dir": Path("runs/a b"), "logger.backend": "true",
        "seed": 3,
    }) == ["algo=sac", "env=my_envs.drift:Drift-v0", "optim.lr=0.001", "optim.max_grad_norm=null",
           "model.hidden=[64, 64]", "eval.video=false", "run_dir=runs/a b", 'logger.backend="true"', "seed=3"]
    with pytest.raises(ConfigError, match=r"^seed=<object object at .*> has the wrong type; allowed: a number, "):
        overrides_argv({"seed": object()})


@pytest.mark.parametrize("engine, overrides", [
    ("offpolicy", {"algo": "sac", "env": "Pendulum-v1", "optim": {"lrr": 1e-3}}),
    ("offpolicy", {"algo": "sac", "env": "Pendulum-v1", "total_env_steps": 0}),
    ("offpolicy", {"algo": "sac", "env": "Pendulum-v1", "model": {"hidden": "wide"}}),
    ("offpolicy", {"algo": "nope"}),
    ("offpolicy", {"algo": "dqn", "env": "Pendulum-v1", "profile": "smoke"}),
    ("a3c", {"workers": 0}),
    ("a3c", {"env": "NoSuchGame"}),
    ("a3c", {"a3c": {"t_max": 2.5}}),
], ids=["unknown key", "out of range", "wrong type", "unknown algo", "continuous actions for dqn", "a3c out of range",
        "a3c unknown game", "a3c wrong type"])
def test_bad_overrides_raise_the_clis_error(engine, overrides, tmp_path, capsys):
    """Each bad input raises ConfigError whose message is the line the CLI prints after ``error:`` (exit 2), before
    any run directory is made."""
    import a3c.api
    import a3c.train
    import offpolicy.api
    import offpolicy.train

    api, cli = {"offpolicy": (offpolicy.api, offpolicy.train), "a3c": (a3c.api, a3c.train)}[engine]
    overrides = {**overrides, "run_dir": tmp_path / "run"}
    with pytest.raises(ConfigError) as raised:
        api.train(**overrides)
    with pytest.raises(SystemExit) as exit_:
        run_cli(cli.main, overrides_argv(overrides))
    assert exit_.value.code == 2 and capsys.readouterr().err == f"error: {raised.value}\n"
    assert not (tmp_path / "run").exists()


def test_the_api_is_a_function_whatever_was_imported_first(monkeypatch):
    """``from offpolicy.api import train`` after ``import offpolicy.train`` (what ``python -m offpolicy.train``'s own
    imports and other modules do), and ``from a3c.api import train`` with neither module imported yet: both give a
    plain function; the entry modules stay plain modules with ``main`` (no module's class is swapped)."""
    import types

    import a3c
    import offpolicy.train

    from offpolicy.api import train as offpolicy_train

    assert isinstance(offpolicy_train, types.FunctionType)
    assert type(sys.modules["offpolicy.train"]) is types.ModuleType and callable(offpolicy.train.main)

    for name in ("a3c.train", "a3c.api"):  # as in a fresh process (restored afterwards)
        monkeypatch.delitem(sys.modules, name, raising=False)
        monkeypatch.delattr(a3c, name.split(".")[1], raising=False)
    from a3c.api import train as a3c_train
    import a3c.train

    assert isinstance(a3c_train, types.FunctionType) and a3c_train.__module__ == "a3c.api"
    assert type(a3c.train) is types.ModuleType and callable(a3c.train.main)
    with pytest.raises(TypeError):
        a3c_train("Pong")  # keyword arguments only, as key=value on the command line


def test_a3c_trains_from_python(tmp_path):
    """A tiny A3C run from Python: its summary is the run's summary.json, and Ctrl-C is the caller's again."""
    from a3c.api import train

    handler = signal.getsignal(signal.SIGINT)
    summary = train(profile="smoke", workers=1, total_frames=320, eval={"interval_frames": 0, "final_episodes": 0},
                    run_dir=tmp_path)
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env"] == "Pong" and summary["frames"] >= 320
    assert summary["worker_updates"] == [summary["updates"]] and summary["updates"] >= 2
    assert signal.getsignal(signal.SIGINT) is handler
