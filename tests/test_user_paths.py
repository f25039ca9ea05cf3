"""Every path a user can pass gives one ``error:`` line naming the key and the problem, and exit code 2: checkpoints
to resume or evaluate that are missing, not files, corrupt, truncated, text or from the other engine, and run,
scratch and suite directories that cannot be created or written."""
from __future__ import annotations

import pytest
import torch

from shared.checkpoint import save_checkpoint
from shared.config import run_cli

A3C_CKPT = {"model": {}, "optimizer": {}, "counters": {"frames": 0}, "config": {}, "num_actions": 6}
OFFPOLICY_CKPT = {"config": {"algo": "dqn"}, "counters": {}, "learner": {}}


def _cli(main, argv, capsys) -> str:
    """Run an entry point as its CLI does; assert exit code 2 and one line; return that line."""
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
    from offpolicy.suite import main as suite

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
                    "networks were built for it)"), line


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
