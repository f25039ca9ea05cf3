"""The strict config: overrides, aliases, groups, and one-line errors with exit code 2."""
import pytest
from omegaconf import OmegaConf

from a3c.config import load_config
from proc import run_module
from shared.config import ConfigError


def test_defaults_aliases_nested_keys_and_profile():
    cfg = load_config(["env=Breakout", "workers=4", "a3c.t_max=5", "lr=1e-3", "total_frames=2e6"])
    assert cfg.env.name == "Breakout" and cfg.workers == 4 and cfg.a3c.t_max == 5
    assert cfg.optim.lr == pytest.approx(1e-3) and isinstance(cfg.optim.lr, float)
    assert cfg.total_frames == 2_000_000 and isinstance(cfg.total_frames, int)
    smoke = load_config(["profile=smoke"])
    assert smoke.profile == "smoke" and smoke.total_frames == 1280 and smoke.env.envs_per_worker == 2


def test_full_and_snake_case_game_names_are_accepted():
    for name in ("ALE/Pong-v5", "PongNoFrameskip-v4", "space_invaders", "SpaceInvaders"):
        assert load_config([f"env={name}"]).env.name == name


@pytest.mark.parametrize("arg, fragment", [
    ("workers=0", "workers=0 is out of range; allowed: an integer >= 1"),
    ("lr=abc", "optim.lr='abc' has the wrong type; allowed: a number"),
    ("env=NoSuchGame", "env.name='NoSuchGame' is not a single-player ALE game"),
    ("wrokers=2", "unknown key 'wrokers'; did you mean workers"),
    ("profile=nope", "profile='nope' does not exist; allowed: smoke"),
    ("model.arch=resnet", "model.arch='resnet' is not allowed; allowed: one of nature, small"),
    ("a3c.minibatches=3", "a3c.minibatches=3 must divide the rollout size"),
    ("env.grayscale=maybe", "env.grayscale='maybe' has the wrong type; allowed: true or false"),
    ("a3c", "argument 'a3c' is not of the form key=value"),
])
def test_bad_values_raise_one_line_naming_the_key(arg, fragment):
    with pytest.raises(ConfigError) as info:
        load_config([arg])
    assert fragment in str(info.value) and "\n" not in str(info.value)


# the messages of bad values are checked in process above; here the real CLI turns one into a line and exit 2
@pytest.mark.parametrize("args", [["workers=0"], ["resume=/no/such/file.pt"]])
def test_cli_prints_one_error_line_and_exits_2(args, tmp_path):
    result = run_module("a3c.train", *args, f"run_dir={tmp_path / 'run'}", timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


def test_help_prints_the_config_reference(capsys):
    from a3c.train import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m a3c.train" in out and "profile=: smoke" in out
    assert "t_max:" in out and "# agent steps per env per rollout" in out


def test_resumed_config_is_the_checkpoint_config_with_overrides():
    base = OmegaConf.to_container(load_config(["env=Breakout", "workers=3"]))
    cfg = load_config(["total_frames=100"], base=base)
    assert cfg.env.name == "Breakout" and cfg.workers == 3 and cfg.total_frames == 100


@pytest.mark.parametrize("name, expected", [("a3c-ALE/Pong-v5", "a3c-ALE-Pong-v5-"),
                                            ("offpolicy-sac-my_envs.drift:Drift-v0", "offpolicy-sac-my_envs.drift-Drift-v0-")])
def test_the_default_run_dir_is_one_directory_under_runs(name, expected, tmp_path, monkeypatch):
    """An env id's ``/`` (ALE/Pong-v5) or ``:`` (module:EnvId) does not nest or break the run's directory."""
    from pathlib import Path

    from shared.config import make_run_dir

    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({"run_dir": None})
    run_dir = make_run_dir(cfg, name)
    assert run_dir.parent == Path("runs") and run_dir.name.startswith(expected), run_dir
    assert (tmp_path / run_dir / "config.yaml").is_file() and cfg.run_dir == str(run_dir)
