"""Every path a user can pass gives one ``error:`` line naming the key and the problem, and exit code 2: checkpoints
to resume or evaluate that are missing, not files, corrupt, truncated, text or from the other engine; run, scratch
and suite directories that cannot be created or written; envs the networks cannot take or whose packages are
missing; a logger that cannot start; resumes that change what the checkpoint was built for; suite arguments that
clash with the suite's own; and output piped into a reader that leaves early (exit 141, no traceback). Found by a
sweep of the entry points with plausible mistakes (2026-12-01)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from shared.checkpoint import save_checkpoint
from shared.config import run_cli

A3C_CKPT = {"model": {}, "optimizer": {}, "counters": {"frames": 0}, "config": {}, "num_actions": 6}
OFFPOLICY_CKPT = {"config": {"algo": "dqn"}, "counters": {}, "learner": {}}


def _cli(main, argv, capsys) -> str:
    """Run an entry point as its CLI does; assert exit code 2 and one line; return that line."""
    capsys.readouterr()  # only this call's output (a run before it may have written to stderr)
    with pytest.raises(SystemExit) as info:
        run_cli(main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def bad_checkpoints(tmp_path):
    """name -> path of a file that is not a usable checkpoint."""
    real = save_checkpoint(tmp_path / "real.pt", {"w": torch.randn(1000), **OFFPOLICY_CKPT})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(bytes(range(256)) * 40)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    return {"missing": tmp_path / "missing.pt", "directory": tmp_path, "truncated": truncated, "corrupt": corrupt,
            "text": text}


EXPECTED = {"missing": "no such file", "directory": "is not a file", "truncated": "is not a checkpoint or is damaged",
            "corrupt": "is not a checkpoint or is damaged", "text": "is not a checkpoint or is damaged"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_bad_checkpoint_files(kind, bad_checkpoints, capsys):
    from a3c.evaluate import main as a3c_evaluate
    from a3c.train import main as a3c_train
    from offpolicy.train import main as offpolicy_train

    path = bad_checkpoints[kind]
    for main, key in ((offpolicy_train, "resume"), (a3c_train, "resume"), (a3c_evaluate, "checkpoint")):
        line = _cli(main, [f"{key}={path}"], capsys)
        assert line.startswith(f"error: {key}={str(path)!r}") and EXPECTED[kind] in line, line


def test_checkpoints_of_the_other_engine(tmp_path, capsys):
    from a3c.evaluate import main as a3c_evaluate
    from a3c.train import main as a3c_train
    from offpolicy.train import main as offpolicy_train

    a3c = save_checkpoint(tmp_path / "a3c.pt", A3C_CKPT)
    offpolicy = save_checkpoint(tmp_path / "offpolicy.pt", OFFPOLICY_CKPT)
    assert "is not a checkpoint of offpolicy.train (it lacks learner)" in _cli(offpolicy_train, [f"resume={a3c}"],
                                                                                capsys)
    assert "is not a checkpoint of a3c.train (it lacks model, optimizer, num_actions)" in _cli(
        a3c_train, [f"resume={offpolicy}"], capsys)
    assert "is not a checkpoint of a3c.train" in _cli(a3c_evaluate, [f"checkpoint={offpolicy}"], capsys)


@pytest.fixture
def blocked(tmp_path):
    """A path whose parent is a plain file: no directory can be created there."""
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "sub"


def test_run_dirs_that_cannot_be_created(blocked, capsys):
    from a3c.train import main as a3c_train
    from offpolicy.train import main as offpolicy_train

    for main, args in ((offpolicy_train, ["algo=dqn", "profile=smoke"]), (a3c_train, ["profile=smoke"])):
        line = _cli(main, [*args, f"run_dir={blocked}"], capsys)
        assert line.startswith(f"error: run_dir={str(blocked)!r} cannot be created or written"), line


def test_replay_scratch_dir_that_cannot_be_created(blocked, tmp_path, capsys):
    from offpolicy.train import main as offpolicy_train

    line = _cli(offpolicy_train, ["algo=dqn", "profile=smoke", "replay.storage=memmap",
                                  f"replay.scratch_dir={blocked}", f"run_dir={tmp_path / 'run'}"], capsys)
    assert line.startswith(f"error: replay.scratch_dir={str(blocked)!r} cannot be created or written"), line


def test_suite_dir_that_cannot_be_created(blocked, capsys):
    from offpolicy.tools.suite import main as suite

    line = _cli(suite, ["profile=smoke", "algos=dqn", f"suite_dir={blocked}"], capsys)
    assert line.startswith(f"error: suite_dir={str(blocked)!r} cannot be created or written"), line


def test_a3c_evaluate_output_dir_that_cannot_be_created(blocked, tmp_path, capsys):
    from a3c.evaluate import main as a3c_evaluate

    ckpt = save_checkpoint(tmp_path / "a3c.pt", A3C_CKPT)
    line = _cli(a3c_evaluate, [f"checkpoint={ckpt}", f"run_dir={blocked}"], capsys)
    assert line.startswith(f"error: run_dir={str(blocked)!r} cannot be created or written"), line


def _smoke_run(tmp_path, *args):
    """A finished off-policy smoke run (DQN, CartPole); returns its checkpoint."""
    from offpolicy.train import compose_config, train

    cfg, _ = compose_config(["algo=dqn", "profile=smoke", "eval.interval_env_steps=0", "eval.final_episodes=0",
                             f"run_dir={tmp_path / 'run'}", *args])
    train(cfg)
    return tmp_path / "run" / "checkpoints" / "last.pt"


def test_resume_that_changes_the_networks_shape(tmp_path, capsys):
    from offpolicy.train import main as offpolicy_train

    ckpt = _smoke_run(tmp_path)
    line = _cli(offpolicy_train, [f"resume={ckpt}", "model.hidden=[64]"], capsys)
    assert line == ("error: model.hidden=[64] differs from the resumed run's; allowed: [32, 32] (the checkpoint's "
                    "networks and loss were built for it)"), line


def test_memmap_resume_with_its_files_gone(tmp_path, capsys):
    """One error line naming the directory; ``replay.storage=memory`` then resumes with an empty replay."""
    import json
    import shutil

    from offpolicy.train import main as offpolicy_train

    ckpt = _smoke_run(tmp_path, "replay.storage=memmap")
    shutil.rmtree(tmp_path / "run" / "replay")
    line = _cli(offpolicy_train, [f"resume={ckpt}", "total_env_steps=500"], capsys)
    assert line.startswith(f"error: replay.scratch_dir={str(tmp_path / 'run' / 'replay')!r}: the resumed run's "
                           "replay files are gone; allowed:"), line
    assert offpolicy_train([f"resume={ckpt}", "total_env_steps=500", "replay.storage=memory"]) == 0
    resumed = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["env_steps"] == 500
    # 100 steps before; the empty replay takes the 200-step prefill again (batches 4 and 5), then 50 steps
    assert resumed["optim_steps"] == 150


def test_obs_norm_on_an_atari_game(capsys):
    from offpolicy.train import main as offpolicy_train

    line = _cli(offpolicy_train, ["algo=dqn", "env=Pong", "env.obs_norm=true"], capsys)
    assert line.startswith("error: env.obs_norm=true is not allowed with an ALE game; allowed:"), line


@pytest.mark.parametrize("args,message", [
    (["algo=dqn", "env=FrozenLake-v1"], "error: env.name='FrozenLake-v1' observes Discrete(16); allowed: an env with a "
                                        "Box observation"),
    (["algo=dqn", "env=Blackjack-v1"], "error: env.name='Blackjack-v1' observes Tuple("),  # Gymnasium's, not ALE's
    (["algo=sac", "env=CartPole-v1"], "error: env.name='CartPole-v1' has no bounded continuous actions; allowed for sac"),
])
def test_envs_the_networks_cannot_take(args, message, capsys, tmp_path):
    from offpolicy.tools.plan import main as plan
    from offpolicy.train import main as offpolicy_train

    assert _cli(offpolicy_train, [*args, "profile=smoke", f"run_dir={tmp_path}"], capsys).startswith(message)
    assert _cli(plan, [*args, "profile=smoke", "measure=false"], capsys).startswith(message)  # the planner too


def test_blackjack_without_a_version_is_the_ale_game():
    from shared.atari import is_atari

    assert is_atari("Blackjack") and is_atari("ALE/Blackjack-v5") and not is_atari("Blackjack-v1")


def test_an_env_whose_package_is_missing(capsys):
    pytest.importorskip("gymnasium")
    if importlib.util.find_spec("Box2D") is not None:
        pytest.skip("Box2D is installed here")
    from offpolicy.train import main as offpolicy_train

    line = _cli(offpolicy_train, ["algo=dqn", "env=LunarLander-v3", "profile=smoke"], capsys)
    assert line.startswith("error: env.name='LunarLander-v3' needs a package that is not installed (Box2D"), line


def test_wandb_without_an_api_key(tmp_path, monkeypatch, capsys):
    """Checked while composing, in both engines (A3C's logger lives in worker 0, where it would be a dead worker)."""
    pytest.importorskip("wandb")
    from a3c.train import main as a3c_train
    from offpolicy.train import main as offpolicy_train
    from shared.logging import check_logger_backend

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    for main, args in ((offpolicy_train, ["algo=dqn", "profile=smoke"]), (a3c_train, ["profile=smoke"])):
        line = _cli(main, [*args, "logger.backend=wandb", f"run_dir={tmp_path / 'run'}"], capsys)
        assert line.startswith("error: logger.backend=wandb has no API key here; allowed: csv, tensorboard"), line
    assert not (tmp_path / "run").exists()  # nothing was started or written
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_logger_backend("wandb")  # offline runs need no key


def test_offpolicy_resumes_that_change_what_the_checkpoint_was_built_for(tmp_path, capsys):
    from offpolicy.train import main as offpolicy_train

    ckpt = _smoke_run(tmp_path, "replay.in_checkpoint=true")
    for change, saved, why in (("env.obs_norm=true", "False", "networks and loss"),
                               ("loss.value_estimator=tdlambda", "td0", "networks and loss"),
                               ("replay.prioritized=true", "False", "its saved replay")):
        line = _cli(offpolicy_train, [f"resume={ckpt}", change], capsys)
        key, _, value = change.partition("=")
        assert line.startswith(f"error: {key}={value.capitalize() if value == 'true' else value} differs from the "
                               f"resumed run's; allowed: {saved} ("), line
        assert why in line, line


def test_a3c_resumes_that_change_the_model_or_optimiser(capsys):
    from omegaconf import OmegaConf

    from a3c.config import load_config
    from shared.config import ConfigError

    base = OmegaConf.to_container(load_config(["profile=smoke"]))
    for change, saved in (("env=Breakout", "Pong"), ("optim.name=adam", "rmsprop"), ("model.arch=nature", "small"),
                          ("env.grayscale=false", "True")):
        with pytest.raises(ConfigError) as info:
            load_config([change], base=base)
        key = {"env": "env.name"}.get(change.partition("=")[0], change.partition("=")[0])
        assert str(info.value).startswith(f"{key}=") and f"differs from the resumed run's; allowed: {saved}" in str(
            info.value), str(info.value)
    assert load_config(["total_frames=2560"], base=base).total_frames == 2560  # what may change still does


@pytest.mark.parametrize("args,message", [
    (["profile=nope", "algos=dqn"], "error: profile='nope' does not exist"),
    (["profile=smoke", "algos=dqn", "algo=sac"], "error: 'algo=sac' is not allowed in a suite"),
    (["profile=smoke", "algos=dqn", "run_dir=x"], "error: 'run_dir=x' is not allowed in a suite"),
    (["profile=smoke", "algos=dqn", "total_env_steps=abc"], "error: total_env_steps='abc' has the wrong type"),
])
def test_suite_arguments_are_checked_before_any_run(args, message, tmp_path, capsys):
    from offpolicy.tools.suite import main as suite

    assert _cli(suite, [*args, f"suite_dir={tmp_path / 'suite'}"], capsys).startswith(message)
    assert not (tmp_path / "suite" / "dqn").exists()  # no run started


@pytest.mark.parametrize("module", ["offpolicy.train", "a3c.train"])
def test_help_piped_into_a_reader_that_leaves(module):
    """``python -m offpolicy.train --help | head -1``: the reader closes the pipe; the CLI ends quietly (141, as a
    shell reports SIGPIPE), without a traceback."""
    import subprocess
    import sys

    from proc import REPO

    proc = subprocess.Popen([sys.executable, "-m", module, "--help"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the help is written
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and b"Traceback" not in err, err.decode()[-2000:]


def test_a_moved_run_resumes_where_it_now_lies(tmp_path):
    """A run directory moved (or copied) after it was made: its resume writes beside its checkpoint, not into the
    directory the run was made in."""
    import json
    import shutil

    from offpolicy.train import main as offpolicy_train

    ckpt = _smoke_run(tmp_path)
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "run", moved)
    assert offpolicy_train([f"resume={moved / 'checkpoints' / 'last.pt'}", "total_env_steps=400"]) == 0
    assert not (tmp_path / "run").exists() and ckpt.parent.parent == tmp_path / "run"
    assert json.loads((moved / "summary.json").read_text())["env_steps"] == 400


def test_a3c_resume_config_follows_its_checkpoint(tmp_path):
    from omegaconf import OmegaConf

    from a3c.config import load_config
    from shared.checkpoint import resumed_config

    base = OmegaConf.to_container(load_config(["profile=smoke", "run_dir=/somewhere/else"]))
    ckpt = tmp_path / "copied-run" / "checkpoints" / "last.pt"
    assert load_config([], base=resumed_config(base, ckpt)).run_dir == str(tmp_path / "copied-run")
    assert load_config(["run_dir=/x"], base=resumed_config(base, ckpt)).run_dir == "/x"  # an explicit one wins


def test_video_of_an_env_that_cannot_render_here(capsys):
    """Without pygame, CartPole cannot render: one error line at once instead of every evaluation failing."""
    if importlib.util.find_spec("pygame") is not None:
        pytest.skip("pygame is installed here")
    from offpolicy.train import main as offpolicy_train

    line = _cli(offpolicy_train, ["algo=dqn", "env=CartPole-v1", "eval.video=true", "profile=smoke"], capsys)
    assert line.startswith("error: eval.video=true cannot render env.name='CartPole-v1' here (pygame"), line
