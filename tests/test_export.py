"""Policy export (``python -m offpolicy.export``, ``python -m a3c.export``): the exported file's actions equal the live
evaluation policy's on real observations of the env, for every off-policy algorithm (with ``env.obs_norm``), DQN on
Atari and A3C (feed-forward and LSTM), in both formats; the files run in a fresh process that imports none of this
project, torchrl or tensordict; the spec describes them; bad inputs are one ``error:`` line with exit 2."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from offpolicy_helpers import REPO, train_inprocess

from offpolicy.algos import ALGORITHMS, ALGOS
from shared.config import run_cli

HAS_ONNX = all(importlib.util.find_spec(name) for name in ("onnx", "onnxscript", "onnxruntime"))
FORMATS = ["torchscript", pytest.param("onnx", marks=pytest.mark.skipif(not HAS_ONNX, reason="no onnx extra"))]
SUFFIX = {"torchscript": ".pt", "onnx": ".onnx"}
# a tiny run per algorithm: 100 prefill env steps, then one batch of 100 with 10 optimiser steps
TINY = ("profile=smoke", "eval.final_episodes=0", "eval.interval_env_steps=0", "total_env_steps=200",
        "collector.prefill_env_steps=100", "optim.utd_ratio=0.1")
ATARI = ("algo=dqn", "env=Pong", "profile=smoke", "eval.final_episodes=0", "eval.interval_env_steps=0",
         "total_env_steps=64", "collector.prefill_env_steps=32", "collector.env_steps_per_batch=32",
         "optim.utd_ratio=0.125", "env.atari.image_size=42", "env.atari.frame_stack=2", "replay.size=100",
         "dqn.conv_precision=float32")  # the file computes in float32: the live policy too, for equal greedy actions
CASES = [*ALGOS, "dqn-atari", "dqn-atari-bf16", "a3c", "a3c-lstm"]


@dataclass
class Case:
    """A checkpoint, the entry point that exports it, and what the live evaluation policy answers to inputs from
    real observations of its env: the exported file must answer the same."""

    checkpoint: Path
    module: str
    inputs: tuple[np.ndarray, ...]
    expected: tuple[np.ndarray, ...]
    discrete: bool


def random_observations(env, steps: int) -> torch.Tensor:
    """``steps`` observations of ``env`` under random actions (episodes restart as they end), as the env gives them."""
    with torch.no_grad():
        observations = env.rollout(steps, break_when_any_done=False)["observation"]
    return observations.reshape(steps, *env.observation_spec_unbatched["observation"].shape)


def offpolicy_case(run_dir: Path, *overrides: str, in_float32: bool = False) -> Case:
    """Train a tiny run, then answer the env's raw observations as ``offpolicy.evaluate`` plays: its eval env (the
    run's ObservationNorm on top) and the checkpoint's evaluation policy (``in_float32``: its CNN computing in
    float32, as the export writes it)."""
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from torchrl.envs import ObservationNorm

    from offpolicy.builder import Builder
    from offpolicy.checkpoint import Checkpoint

    summary = train_inprocess(*overrides, f"run_dir={run_dir}")
    checkpoint = Checkpoint.read(summary["checkpoint"])
    builder = Builder(OmegaConf.create(checkpoint.config))
    raw_env, live_env = builder.eval_env(), builder.eval_env(obs_norm=checkpoint.obs_norm)
    try:
        raw = random_observations(raw_env, 64)
        policy = checkpoint.eval_policy(live_env)
        if in_float32:
            from offpolicy.export import in_float32 as to_float32

            policy = to_float32(policy)
        seen = TensorDict({"observation": raw}, [len(raw)])
        for norm in [t for t in live_env.transform if isinstance(t, ObservationNorm)]:  # what the policy sees
            seen = norm(seen)
        with torch.no_grad():
            action = policy(seen)["action"]
    finally:
        raw_env.close()
        live_env.close()
    discrete = ALGORITHMS[checkpoint.config["algo"]].discrete
    if discrete:  # the eval policy writes one-hot actions; the file gives their index
        assert (action.sum(-1) == 1).all()
        action = action.argmax(-1)
    return Case(Path(summary["checkpoint"]), "offpolicy.export", (raw.numpy(),), (action.numpy(),), discrete)


def a3c_case(run_dir: Path, *overrides: str) -> Case:
    """A fresh A3C checkpoint (as a3c.train writes it) of a small model, and what ``a3c.evaluate`` plays on
    observations of 8 Pong games after 30 random steps: the argmax of the logits, the LSTM from a state it reached on
    the step before (so the file's state input and output are checked too)."""
    from omegaconf import OmegaConf

    from a3c.config import load_config
    from a3c.model import build_model
    from a3c.train import CHECKPOINT_KEYS
    from shared.atari import AtariBatch, AtariSettings
    from shared.checkpoint import save_checkpoint

    cfg = load_config(["env=Pong", "profile=smoke", "env.image_size=42", "env.frame_stack=2", *overrides])
    torch.manual_seed(0)
    env = AtariBatch(AtariSettings.from_config(cfg.env), 8, seed=3)
    model = build_model(cfg, env.num_actions)
    saved = {"model": model.state_dict(), "optimizer": {}, "counters": {"frames": 0, "updates": 0, "episodes": 0},
             "config": OmegaConf.to_container(cfg), "num_actions": env.num_actions}
    path = save_checkpoint(run_dir / "checkpoints" / "last.pt", {k: saved[k] for k in CHECKPOINT_KEYS})
    try:
        obs = env.reset()
        rng = np.random.default_rng(0)
        for _ in range(30):
            before, obs = obs, env.step(rng.integers(env.num_actions, size=8)).obs
    finally:
        env.close()
    with torch.no_grad():
        _, _, state = model.step(torch.from_numpy(before), model.initial_state(8))
        logits, _, next_state = model.step(torch.from_numpy(obs), state)
    inputs = (obs,) if state is None else (obs, state[0].numpy(), state[1].numpy())
    expected = (logits.argmax(-1).numpy(),) + (() if state is None else tuple(s.numpy() for s in next_state))
    return Case(path, "a3c.export", inputs, expected, True)


_cases: dict[str, Case] = {}


def case(name: str, root: Path) -> Case:
    """The case ``name`` (an algorithm, ``dqn-atari``, ``dqn-atari-bf16``, ``a3c`` or ``a3c-lstm``), made once per
    test module."""
    if name not in _cases:
        run_dir = root / name
        if name == "a3c":
            _cases[name] = a3c_case(run_dir)
        elif name == "a3c-lstm":
            _cases[name] = a3c_case(run_dir, "model.recurrent=lstm", "model.lstm_size=32")
        elif name == "dqn-atari":
            _cases[name] = offpolicy_case(run_dir, *ATARI)
        elif name == "dqn-atari-bf16":  # trained with its CNN in bf16: the file computes the same weights in float32
            _cases[name] = offpolicy_case(run_dir, *ATARI, "dqn.conv_precision=bfloat16", in_float32=True)
        else:  # ObservationNorm statistics from 50 random steps, folded into the file
            _cases[name] = offpolicy_case(run_dir, f"algo={name}", f"env={ALGORITHMS[name].smoke_env}", *TINY,
                                          "env.obs_norm=true", "env.obs_norm_init_steps=50")
    return _cases[name]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    yield tmp_path_factory.mktemp("export")
    _cases.clear()
    _exports.clear()


_exports: dict[tuple[str, str], tuple[Path, dict]] = {}


def exported(name: str, fmt: str, root: Path) -> tuple[Path, dict]:
    """Case ``name`` exported by its CLI in format ``fmt`` (once per test module), to the default place: the run's
    ``export/policy.pt`` or ``.onnx``; returns the file and its spec."""
    if (name, fmt) not in _exports:
        c = case(name, root)
        assert importlib.import_module(c.module).main([f"checkpoint={c.checkpoint}", f"format={fmt}"]) == 0
        path = c.checkpoint.parent.parent / "export" / f"policy{SUFFIX[fmt]}"
        _exports[name, fmt] = path, json.loads(path.with_name(path.name + ".json").read_text())
    return _exports[name, fmt]


def run_file(path: Path, inputs) -> tuple[np.ndarray, ...]:
    if path.suffix == ".pt":
        out = torch.jit.load(str(path))(*(torch.from_numpy(a) for a in inputs))
        return tuple(o.numpy() for o in (out if isinstance(out, tuple) else (out,)))
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path))
    return tuple(session.run(None, {i.name: a for i, a in zip(session.get_inputs(), inputs)}))


def assert_same_actions(c: Case, answers) -> None:
    assert len(answers) == len(c.expected)
    if c.discrete:
        np.testing.assert_array_equal(answers[0], c.expected[0])
        assert answers[0].dtype == np.int64
    else:
        np.testing.assert_allclose(answers[0], c.expected[0], rtol=1e-5, atol=1e-6)
    for answer, expected in zip(answers[1:], c.expected[1:]):  # the LSTM's next state
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", CASES)
def test_the_exported_policy_acts_as_the_live_evaluation_policy(name, fmt, root):
    c = case(name, root)
    path, spec = exported(name, fmt, root)
    assert_same_actions(c, run_file(path, c.inputs))
    if fmt == "torchscript" and c.inputs[0].dtype == np.float32:  # float64 observations are cast inside
        assert_same_actions(c, run_file(path, (c.inputs[0].astype(np.float64),)))
    # the spec names the file and describes what goes in and comes out
    assert spec["file"] == path.name and spec["format"] == fmt and spec["checkpoint"] == str(c.checkpoint)
    assert [(p["name"], p["shape"][1:], p["dtype"]) for p in spec["inputs"]] == \
        [(n, list(a.shape[1:]), str(a.dtype)) for n, a in zip(("observation", "h", "c"), c.inputs)]
    assert [(p["shape"][1:], p["dtype"]) for p in spec["outputs"]] == \
        [(list(a.shape[1:]), str(a.dtype)) for a in c.expected]
    if not c.discrete:  # continuous actions within the env's bounds (Pendulum: [-2, 2])
        assert spec["outputs"][0]["low"] == [-2.0] and spec["outputs"][0]["high"] == [2.0]
        assert np.abs(c.expected[0]).max() <= 2.0 and c.expected[0].std() > 0


def test_the_files_run_in_a_process_that_imports_none_of_the_project(root, tmp_path):
    """Every case's files (both formats where onnx is installed) run in a new interpreter started in an empty
    directory, isolated (``-I``: no PYTHONPATH, no user site), and answer as the live policy; afterwards none of
    offpolicy, a3c, shared, torchrl and tensordict has been imported."""
    formats = ["torchscript", "onnx"] if HAS_ONNX else ["torchscript"]
    jobs = []
    for name in CASES:
        for fmt in formats:
            path, _ = exported(name, fmt, root)
            inputs = []
            for i, array in enumerate(case(name, root).inputs):
                np.save(tmp_path / f"{name}-{fmt}-in{i}.npy", array)
                inputs.append(str(tmp_path / f"{name}-{fmt}-in{i}.npy"))
            jobs.append({"name": name, "file": str(path), "inputs": inputs, "out": str(tmp_path / f"{name}-{fmt}")})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    script = """
import json, sys
import numpy as np
import torch
for job in json.load(open("jobs.json")):
    inputs = [np.load(p) for p in job["inputs"]]
    if job["file"].endswith(".pt"):
        out = torch.jit.load(job["file"])(*[torch.from_numpy(a) for a in inputs])
        out = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    else:
        import onnxruntime
        session = onnxruntime.InferenceSession(job["file"])
        out = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), inputs)})
    for i, o in enumerate(out):
        np.save(f"{job['out']}-out{i}.npy", o)
print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}), "path": sys.path}))
"""
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    (run_dir / "jobs.json").write_text((tmp_path / "jobs.json").read_text())
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    done = subprocess.run([sys.executable, "-I", "-c", script], cwd=run_dir, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert not {"offpolicy", "a3c", "shared", "torchrl", "tensordict"} & set(loaded["modules"]), loaded["modules"]
    assert str(REPO) not in loaded["path"] and "" not in loaded["path"]
    assert ("onnxruntime" in loaded["modules"]) == HAS_ONNX
    for job in jobs:
        c = _cases[job["name"]]
        assert_same_actions(c, tuple(np.load(f"{job['out']}-out{i}.npy") for i in range(len(c.expected))))


@pytest.mark.parametrize("module", ["offpolicy.export", "a3c.export"])
@pytest.mark.parametrize("args, message", [
    ([], "checkpoint is required"),
    (["checkpoint=/nonexistent/last.pt"], "checkpoint='/nonexistent/last.pt': no such file"),
    (["checkpoint=x.pt", "format=pickle"], "format='pickle' is not allowed; allowed: one of torchscript, onnx"),
    (["checkpoint=x.pt", "nope=1"], "unknown key 'nope'"),
])
def test_bad_arguments_are_one_error_line_and_exit_2(module, args, message, capsys):
    assert_one_error_line(module, args, message, capsys)


def assert_one_error_line(module: str, args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(importlib.import_module(module).main, args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


@pytest.mark.parametrize("module, other, message", [
    ("offpolicy.export", "a3c", "is not a checkpoint of offpolicy.train"),
    ("a3c.export", "dqn", "is not a checkpoint of a3c.train"),
])
def test_the_other_engine_s_checkpoint_is_one_error_line(module, other, message, root, capsys):
    assert_one_error_line(module, [f"checkpoint={case(other, root).checkpoint}"], message, capsys)


def test_out_names_the_file_and_its_spec_goes_beside_it(root, tmp_path):
    from offpolicy.export import main

    c = case("dqn", root)
    assert main([f"checkpoint={c.checkpoint}", f"out={tmp_path / 'mine' / 'cartpole.pt'}"]) == 0
    spec = json.loads((tmp_path / "mine" / "cartpole.pt.json").read_text())
    assert spec["file"] == "cartpole.pt" and spec["format"] == "torchscript"
    assert_same_actions(c, run_file(tmp_path / "mine" / "cartpole.pt", c.inputs))


def test_an_out_path_that_cannot_be_written_is_one_error_line(root, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert_one_error_line("offpolicy.export", [f"checkpoint={case('dqn', root).checkpoint}",
                                               f"out={blocker / 'policy.pt'}"], "out=", capsys)


def test_onnx_without_its_packages_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # what importing a missing package does
    for module in ("offpolicy.export", "a3c.export"):
        assert_one_error_line(module, ["checkpoint=x.pt", "format=onnx"], "format=onnx needs the onnx extra", capsys)
