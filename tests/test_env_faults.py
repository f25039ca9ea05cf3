"""The user's world, as a catalogue: an env class of the user's own written the way Gymnasium's docs write one trains;
whatever the user's env or script does wrong (raises in reset or step, returns a non-finite observation or reward,
fails to import, cannot render, is registered by hand, starts a spawning run without a ``__main__`` guard) is one
line, never a lost run. Every env fault is checked in every collection mode it applies to: exit code 5, one stderr
line without a traceback, ``summary.json`` with status failed, and a checkpoint of the last whole round that resumes
to completion once the env is fixed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from offpolicy_helpers import REPO, summary, train_inprocess
from proc import wait_no_ray

from offpolicy import api, train
from shared.config import ConfigError, run_cli

PACKAGE = "user_envs"
# Gymnasium's docs' shape: spaces on the class, no constructor (or one without the keywords torchrl's GymEnv passes)
KINDS = '''
import os

import gymnasium as gym
import numpy as np


class Walk(gym.Env):
    """A 10-step walk on a line: left or right by 0.1, rewarded for staying near 0."""
    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = float(self.np_random.uniform(-1, 1)), 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.x += 0.1 if np.asarray(action).sum() > 0 else -0.1
        return self._obs(), -abs(self.x), False, self.t == 10, {}

    def _obs(self):
        return np.array([self.x, self.t / 10], np.float32)


class NoInit(Walk):
    pass


class BareInit(Walk):
    def __init__(self):
        self.created = True


class Sized(Walk):
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, size=5):
        self.size = size


class Rendering(Walk):
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def render(self):
        return np.zeros((64, 64, 3), np.uint8)


class Faulty(Walk):
    """Fails at its env step FAULT_AT (counted over its episodes; unset: never): ``step`` raises, ``reset`` raises
    (the first reset from that step on), a NaN observation, an infinite reward."""

    def __init__(self, fault, continuous=False):
        self.fault, self.steps = fault, 0
        self.at = int(os.environ.get("FAULT_AT", "0"))
        if continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        if self.fault == "reset" and self.at and self.steps >= self.at:
            raise RuntimeError("reset broke")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.steps += 1
        armed = self.steps == self.at
        if self.fault == "step" and armed:
            raise ValueError(f"step {self.steps} broke")
        obs, reward, terminated, truncated, info = super().step(action)
        if self.fault == "nan_obs" and armed:
            obs[0] = np.nan
        if self.fault == "inf_reward" and armed:
            reward = float("inf")
        return obs, reward, terminated, truncated, info


for cls in (NoInit, BareInit, Sized, Rendering):
    gym.register(f"{cls.__name__}-v0", entry_point=cls)
for fault in ("step", "reset", "nan_obs", "inf_reward"):
    gym.register(f"{fault}-v0", entry_point=Faulty, kwargs={"fault": fault})
    gym.register(f"{fault}-continuous-v0", entry_point=Faulty, kwargs={"fault": fault, "continuous": True})
'''


@pytest.fixture(scope="module")
def user_envs(tmp_path_factory):
    """The package ``user_envs`` on this process's path and on PYTHONPATH (env worker processes and Ray actors
    import it from the env's name); the directory."""
    import gymnasium

    root = tmp_path_factory.mktemp("pkgs")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "kinds.py").write_text(KINDS)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", str(root))
        yield root
    for name in (f"{PACKAGE}.kinds", PACKAGE):
        sys.modules.pop(name, None)
    for env_id in [k for k, spec in gymnasium.registry.items() if str(spec.entry_point).startswith(PACKAGE)]:
        gymnasium.registry.pop(env_id)
    for env_id in ("NoInit-v0", "BareInit-v0", "Sized-v0", "Rendering-v0"):
        gymnasium.registry.pop(env_id, None)


def _name(env_id: str) -> str:
    return f"{PACKAGE}.kinds:{env_id}"


# --- an ordinary env class trains ---------------------------------------------------------------------------------

@pytest.mark.parametrize("algo, env_id, extra", [
    ("dqn", "NoInit-v0", []),
    ("dqn", "NoInit-v0", ["collector.lean=false"]),  # torchrl's Collector over GymWrapper
    ("dqn", "BareInit-v0", []),
    ("sac", "Sized-v0", []),
    ("sac", "Rendering-v0", ["eval.video=true"]),
])
def test_an_ordinary_env_class_trains_and_evaluates(user_envs, tmp_path, algo, env_id, extra):
    """No constructor, one without arguments, one with a keyword of its own, one taking render_mode: each trains and
    evaluates. (torchrl's GymEnv passed frameskip=1 to every constructor: 'NoInit() takes no arguments'.)"""
    s = train_inprocess(f"algo={algo}", f"env={_name(env_id)}", "profile=smoke", *extra, f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["episodes"] == 30  # the walk's 10-step episodes
    assert s["eval_error"] is None and s["eval_return_last"] is not None
    if "eval.video=true" in extra:
        assert list((tmp_path / "videos").glob("*.mp4"))


# --- env faults x collection modes --------------------------------------------------------------------------------

CAUSES = {
    "step": "step raised ValueError: step {at} broke",
    "reset": "reset raised RuntimeError: reset broke",
    "nan_obs": "step returned a non-finite observation (nan at index [0])",
    "inf_reward": "step returned a non-finite reward (inf)",
}
LOCAL_CASES = [
    # mode, algo, fault, FAULT_AT, extra overrides, env steps of the run at the fault
    ("lean", "dqn", "step", 250, [], 200),
    ("lean", "dqn", "reset", 250, [], 200),
    ("lean", "sac", "nan_obs", 50, [], 0),  # in the prefill: SAC's actor once got the NaN ("std >= 0.0")
    ("lean", "dqn", "inf_reward", 250, [], 200),
    ("torchrl", "td3", "nan_obs", 250, ["collector.lean=false"], 200),  # after learning started
    ("torchrl", "dqn", "step", 250, ["collector.lean=false"], 200),
    ("serial", "dqn", "reset", 120, ["env.num_envs=2", "collector.lean=false"], 200),
    ("overlap", "dqn", "step", 250, ["collector.overlap=true"], 200),
    ("process", "dqn", "step", 120, ["env.num_envs=2", "env.vector=process", "collector.lean=false"], 200),
    ("process", "sac", "nan_obs", 120, ["env.num_envs=2", "env.vector=process", "collector.lean=false"], 200),
]


def _fault_line(env: str, fault: str, at: int, run_steps: int) -> str:
    """(A reset fault comes at the episode end of step ``at``: the cases put it at a multiple of 10.)"""
    return (f"env '{env}' failed at env step {at} of its copy: {CAUSES[fault].format(at=at)} (after {run_steps} "
            "env steps of the run)")


def _check_failed_run(run_dir, line: str, run_steps: int) -> dict:
    """The failed run's summary and checkpoint: status failed, the fault recorded, the checkpoint at the last whole
    round (counters equal to the learner's)."""
    s = summary(run_dir)
    assert s["status"] == "failed" and s["error"] == line and s["env_steps"] == run_steps
    assert s["env_fault"]["env"] in line and s["env_fault"]["cause"] in line
    ckpt = torch.load(s["checkpoint"], weights_only=True)
    assert ckpt["counters"]["env_steps"] == run_steps and ckpt["learner"]["steps"] == ckpt["counters"]["optim_steps"]
    return s


@pytest.mark.parametrize("mode, algo, fault, at, extra, run_steps", LOCAL_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in LOCAL_CASES])
def test_an_env_fault_ends_the_run_with_one_line_and_a_checkpoint_that_resumes(
        user_envs, tmp_path, monkeypatch, capfd, mode, algo, fault, at, extra, run_steps):
    env = _name(f"{fault}-continuous-v0" if algo != "dqn" else f"{fault}-v0")
    monkeypatch.setenv("FAULT_AT", str(at))
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        run_cli(train.main, [f"algo={algo}", f"env={env}", "profile=smoke", *extra, f"run_dir={run_dir}"])
    err = capfd.readouterr().err  # this process's and its children's (env workers, the overlap child)
    line = _fault_line(env, fault, at, run_steps)
    assert exit_.value.code == train.EXIT_ENV_FAULT == 5
    assert err.strip().splitlines() == [f"error: {line}; latest checkpoint: {run_dir / 'checkpoints' / 'last.pt'}"]
    s = _check_failed_run(run_dir, line, run_steps)
    monkeypatch.delenv("FAULT_AT")  # the env fixed: the checkpoint resumes to the end
    resumed = train_inprocess(f"resume={s['checkpoint']}", f"run_dir={tmp_path / 'resumed'}")
    # every invariant held, and the run ended whole: final evaluation and summary (env.vector=process runs used to
    # crash at their end, closing the ParallelEnv a second time)
    assert resumed["status"] == "completed" and resumed["error"] is None and resumed["eval_return_last"] is not None
    assert (resumed["env_steps"], resumed["batches"]) == (300, 3) and resumed["optim_steps"] >= s["optim_steps"]


def test_an_env_fault_in_a_ray_collector_actor_ends_the_run_the_same_way(user_envs, tmp_path):
    """The same on Ray (a collector actor's env returns a NaN observation in round 3): exit 5, the line, the
    checkpoint that resumes, no Ray process left. One learner rank (the resume keeps it): the fault is the collector
    actors' matter, and each rank is one more process to start on a 2-core machine."""
    env, run_dir = _name("nan_obs-v0"), tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "offpolicy.train", "algo=dqn", f"env={env}", "profile=ray_smoke",
                           "ray.world_size=1", f"run_dir={run_dir}"], cwd=REPO, capture_output=True, text=True,
                          timeout=280, env={**os.environ, "FAULT_AT": "450", "PYTHONUNBUFFERED": "1"})
    line = _fault_line(env, "nan_obs", 450, 800)
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1] == (
        f"error: {line}; latest checkpoint: {run_dir / 'checkpoints' / 'last.pt'}")
    s = _check_failed_run(run_dir, line, 800)
    assert not wait_no_ray()
    resumed = subprocess.run([sys.executable, "-m", "offpolicy.train", f"resume={s['checkpoint']}",
                              f"run_dir={tmp_path / 'resumed'}"], cwd=REPO, capture_output=True, text=True,
                             timeout=280)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert summary(tmp_path / "resumed")["env_steps"] == 2000
    assert not wait_no_ray()


# --- the user's module and script ---------------------------------------------------------------------------------

@pytest.mark.parametrize("source, expected", [
    ("raise RuntimeError('no licence server')", "raised RuntimeError: no licence server"),
    ("def broken(:\n    pass", "raised SyntaxError (line 1): invalid syntax"),
])
def test_an_env_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch, capsys, source, expected):
    (tmp_path / "broken_envs.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_envs", raising=False)
    with pytest.raises(SystemExit) as exit_:
        run_cli(train.main, ["algo=dqn", "env=broken_envs:Walk-v0", "profile=smoke"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith(
        f"error: env.name='broken_envs:Walk-v0': importing module 'broken_envs' {expected}") and "\n" not in err
    with pytest.raises(ConfigError, match="importing module 'broken_envs'"):
        api.train(algo="dqn", env="broken_envs:Walk-v0", profile="smoke")


def test_no_env_name_is_one_line(capsys):
    """(A TypeError from deep in the config check before.)"""
    expected = ("env.name=None is not allowed; allowed: a Gymnasium id, module:EnvId, an ALE game or "
                "dmc:<domain>-<task> (leave env out for the algorithm's default)")
    with pytest.raises(ConfigError) as error:
        api.train(algo="dqn", env=None, profile="smoke")
    assert str(error.value) == expected
    for word in ("env=null", "env="):
        with pytest.raises(SystemExit) as exit_:
            run_cli(train.main, ["algo=dqn", word, "profile=smoke"])
        assert exit_.value.code == 2 and capsys.readouterr().err.strip() == f"error: {expected}"


def test_a_video_of_an_env_that_cannot_render_is_one_line(user_envs):
    with pytest.raises(ConfigError, match=r"^eval\.video=true cannot render env\.name='user_envs\.kinds:NoInit-v0'"):
        api.train(algo="dqn", env=_name("NoInit-v0"), profile="smoke", eval={"video": True})


def test_a_bare_id_registered_by_hand_is_warned_of_at_the_start(user_envs, capsys):
    """Imported by hand, then named by its bare id: training here works, a resume or evaluate elsewhere would not
    find it, so the start says so and names the spelling that works."""
    import importlib

    from offpolicy.config import compose_config

    importlib.import_module(f"{PACKAGE}.kinds")
    compose_config(["algo=dqn", "env=NoInit-v0", "profile=smoke"])
    assert capsys.readouterr().err.strip() == (
        "warning: env.name='NoInit-v0' is registered by user_envs.kinds that this process imported by hand; a resume, "
        "offpolicy.evaluate / export and env worker processes make the env from its name alone and will not find it; "
        "use env.name=user_envs.kinds:NoInit-v0, which imports it wherever the env is made")
    compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("call, what", [
    ("from a3c.api import train\ntrain(env='Pong', profile='smoke', run_dir={run_dir!r})", "a3c.train"),
    ("from offpolicy.api import train\ntrain(algo='dqn', profile='smoke', collector={{'overlap': True}}, "
     "run_dir={run_dir!r})", "offpolicy.train with collector.overlap=true"),
], ids=["a3c", "offpolicy-overlap"])
def test_a_spawning_run_from_a_script_without_a_main_guard_is_refused_before_any_child(tmp_path, call, what):
    """Spawned children import the script again: without the guard each would start the run again (8 spawn
    tracebacks and 'worker 1 died'). The run refuses at once, before its run directory or any child; with the guard
    (and from `python -c`) the check passes."""
    run_dir = tmp_path / "run"
    script = tmp_path / "train_it.py"
    script.write_text("import sys\n" + call.format(run_dir=str(run_dir)) + "\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"shared.config.ConfigError: {what} was started at line 3 of {script} outside an `if __name__ == "
        "\"__main__\":` block; its child processes are spawned and import the script again, which would start the run "
        "again in each of them; allowed: the call inside `if __name__ == \"__main__\":`")
    assert "SpawnProcess" not in proc.stderr and not run_dir.exists()


def test_the_main_guard_check_passes_a_guarded_call_and_python_c(tmp_path):
    check = "from shared.processes import unguarded_main_line\n"
    guarded = tmp_path / "guarded.py"
    guarded.write_text(check + textwrap.dedent('''
        def main():
            print(unguarded_main_line())


        if __name__ == "__main__":
            main()
        '''))
    unguarded = tmp_path / "unguarded.py"
    unguarded.write_text(check + "print(unguarded_main_line())\n")
    outputs = [subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=60).stdout
               for args in ([str(guarded)], [str(unguarded)], ["-c", check + "print(unguarded_main_line())"])]
    assert outputs == ["None\n", f"('{unguarded}', 2)\n", "None\n"]
