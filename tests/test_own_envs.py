"""Envs of the user's own package by Gymnasium's ``module:EnvId`` name: trained (from Python), resumed, evaluated and
planned by the name alone, and every bad name one ``error:`` line with exit 2, in both engines. (A fresh process
importing the module from a saved name: docs/usage.md's example in tests/test_docs.py.)"""
from __future__ import annotations

import json
import sys

import pytest

from shared.config import run_cli

NAME = "own_envs.walk:Walk-v0"
# a walk on a line: left or right by 0.1, rewarded for staying near 0, 10-step episodes; the observation is the
# position and the elapsed fraction of the episode
WALK = '''
import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.steps = float(self.np_random.uniform(-1, 1)), 0
        return self._observation(), {}

    def step(self, action):
        self.position += 0.1 if action == 1 else -0.1
        self.steps += 1
        return self._observation(), -abs(self.position), False, self.steps == 10, {}

    def _observation(self):
        return np.array([self.position, self.steps / 10], np.float32)


gym.register("Walk-v0", entry_point=Walk)
'''


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """The package ``own_envs`` (module ``walk`` registers ``Walk-v0``) written to a temporary directory on this
    process's path; the directory. Forgotten afterwards (modules and id)."""
    import gymnasium

    root = tmp_path_factory.mktemp("pkgs")
    (root / "own_envs").mkdir()
    (root / "own_envs" / "__init__.py").write_text("")
    (root / "own_envs" / "walk.py").write_text(WALK)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        yield root
    for name in ("own_envs.walk", "own_envs"):
        sys.modules.pop(name, None)
    gymnasium.registry.pop("Walk-v0", None)


@pytest.fixture(scope="module")
def walk_run(walk):
    """DQN's smoke run on Walk-v0 from Python; its summary."""
    from offpolicy.api import train

    return train(algo="dqn", env=NAME, profile="smoke", run_dir=walk / "run")


def _error(main, argv, capsys) -> str:
    """The one stderr line of an entry point that exits 2."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and "Traceback" not in err, err
    return err


def test_own_env_trains(walk, walk_run):
    run_dir = walk / "run"
    assert walk_run == json.loads((run_dir / "summary.json").read_text())
    assert walk_run["status"] == "completed" and walk_run["env"] == NAME
    assert walk_run["env_steps"] == 300 and walk_run["episodes"] == 30  # Walk's 10-step episodes: the env was ours
    assert f"name: {NAME}" in (run_dir / "config.yaml").read_text()


def test_own_env_resumes_evaluates_and_plans(walk, walk_run, capsys):
    from offpolicy import evaluate
    from offpolicy.api import train
    from offpolicy.tools import plan

    checkpoint = walk / "run" / "checkpoints" / "last.pt"
    resumed = train(resume=checkpoint, total_env_steps=400, run_dir=walk / "resumed")
    assert resumed["status"] == "completed" and resumed["env"] == NAME
    assert resumed["env_steps"] == 400 and resumed["episodes"] == 40

    assert evaluate.main([f"checkpoint={checkpoint}", "episodes=2", f"run_dir={walk / 'evaluated'}"]) == 0
    evaluation = json.loads((walk / "evaluated" / "evaluation.json").read_text())
    assert evaluation["env"] == NAME and evaluation["lengths"] == [10, 10]

    planned = {}
    for env in (NAME, "CartPole-v1"):
        capsys.readouterr()
        assert plan.main(["algo=dqn", f"env={env}", "profile=smoke", "measure=false"]) == 0
        planned[env] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert planned[NAME]["env"] == NAME and planned[NAME]["transitions"] == 300
    # a stored transition measured on a step of Walk: observation and next observation of 2 float32, CartPole's 4
    assert planned["CartPole-v1"]["bytes_per_transition"] - planned[NAME]["bytes_per_transition"] == 2 * 2 * 4


def test_evaluating_without_the_module_is_one_error_line(walk, walk_run, monkeypatch, capsys):
    """A checkpoint of an own env evaluated where its package is not importable (here: taken off the path and
    forgotten): the module is imported again from the saved name, and fails with one line."""
    from offpolicy import evaluate

    for name in ("own_envs.walk", "own_envs"):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(walk)])
    line = _error(evaluate.main, [f"checkpoint={walk / 'run' / 'checkpoints' / 'last.pt'}"], capsys)
    assert line == (f"error: env.name='{NAME}': module 'own_envs.walk' cannot be imported (No module named "
                    "'own_envs'); allowed: a module on PYTHONPATH (or installed) that registers the id with "
                    "gymnasium.register")


@pytest.mark.parametrize("env, expected", [
    ("no_such_package.envs:Walk-v0", "env.name='no_such_package.envs:Walk-v0': module 'no_such_package.envs' cannot "
                                     "be imported (No module named 'no_such_package'); allowed: a module on "
                                     "PYTHONPATH (or installed) that registers the id with gymnasium.register"),
    ("own_envs.walk:Run-v0", "env.name='own_envs.walk:Run-v0': module 'own_envs.walk' registers no Gymnasium id "
                             "'Run-v0'; allowed: an id it registers (Walk-v0)"),
    ("own_envs:Walk-v0:x", "env.name='own_envs:Walk-v0:x' is not allowed; allowed: module:EnvId (one colon, e.g. "
                           "my_pkg.envs:MyEnv-v0), a Gymnasium id, an ALE game or dmc:<domain>-<task>"),
    (":Walk-v0", "env.name=':Walk-v0' is not allowed; allowed: module:EnvId (one colon"),
], ids=["missing module", "unregistered id", "two colons", "no module"])
def test_bad_own_env_names_are_one_error_line(walk, env, expected, capsys):
    from offpolicy.train import main

    assert _error(main, ["algo=dqn", f"env={env}", "profile=smoke"], capsys).startswith(f"error: {expected}")


def test_a3c_refuses_an_own_env(walk, capsys):
    """A3C's workers step ale_py's AtariVectorEnv: an own env (even one that imports and registers) is refused."""
    from a3c.train import main

    line = _error(main, [f"env={NAME}", "profile=smoke"], capsys)
    assert line.startswith(f"error: env.name='{NAME}' is not allowed: A3C takes ALE games only")
