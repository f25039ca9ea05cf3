"""Bad input: one ``error:`` line naming the key and what is allowed, exit code 2, no traceback."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import run_cli

from omegaconf import OmegaConf

from offpolicy.algos import ALGOS
from offpolicy.checkpoint import FORMAT_VERSION
from offpolicy.train import compose_config, main
from shared.config import ConfigError


@pytest.mark.parametrize("args, needle", [
    (["algo=ppo"], f"algo='ppo' does not exist; allowed: {', '.join(sorted(ALGOS))}"),
    (["optim.batch_size=0"], "optim.batch_size=0 is out of range"),
    (["optim.btach_size=64"], "unknown key 'optim.btach_size'; did you mean optim.batch_size"),
    (["optim.utd_ratio=0.3333", "collector.env_steps_per_batch=256"], "optim.utd_ratio=0.3333"),
    (["env=NoSuchEnv-v0"], "env.name='NoSuchEnv-v0' is not a Gymnasium id or an ALE game"),
    (["algo=sac", "env=Pong"], "env.name='Pong' is an ALE game; allowed for sac"),
    (["algo=td3", "td3.noise=pink"], "td3.noise='pink' is not allowed; allowed: one of gaussian, ou"),
    (["algo=dqn", "sac.alpha_init=0.1"], "unknown key 'sac.alpha_init'"),
    (["model.hidden=[256,-1]"], "model.hidden=[256, -1] is not allowed"),
    (["collector.prefill_env_steps=5000", "replay.size=1000"], "collector.prefill_env_steps=5000 is not allowed"),
    (["collector.overlap_timeout_s=0"], "collector.overlap_timeout_s=0 is out of range; allowed: a number >= 1"),
    (["profile=huge"], "profile='huge' does not exist; allowed: atari, atari_cleanrl, humanoid_scale, local, ray_smoke, scale, scale_rehearsal, smoke"),
    (["resume=/nonexistent/last.pt"], "resume='/nonexistent/last.pt': no such file"),
    (["logger.backend=mlflow"], "logger.backend='mlflow' is not allowed"),
    (["total_env_steps"], "is not of the form key=value"),
    (["compile.mode=fast"], "compile.mode='fast' is not allowed; allowed: one of default, reduce-overhead"),
    (["compile.enabled=maybe"], "compile.enabled='maybe' is not allowed; allowed: one of auto, true, false"),
    (["compile.enabled=1"], "compile.enabled='1' is not allowed; allowed: one of auto, true, false"),
    (["compile.auto_min_optim_steps=-1"], "compile.auto_min_optim_steps=-1 is out of range; allowed: an integer >= 0"),
    (["compile.enabled=auto", "compile.cudagraphs=true"], "compile.cudagraphs=true is not allowed here; allowed: "
                                                          "with compile.enabled=true on a CUDA learner"),
    (["compile.enabled=true", "compile.cudagraphs=true"], "compile.cudagraphs=true is not allowed here; allowed: "
                                                          "with compile.enabled=true on a CUDA learner"),
    (["env.kind=atari"], "env.kind='atari' is not allowed; allowed: set env.name (env.kind is read off it"),
])
def test_bad_input_is_one_config_error(args, needle):
    with pytest.raises(ConfigError) as info:
        compose_config(args)
    message = str(info.value)
    assert needle in message and "\n" not in message


def test_wrong_action_space_is_a_config_error(tmp_path):
    cfg, _ = compose_config(["algo=sac", "env=CartPole-v1", f"run_dir={tmp_path / 'run'}"])
    from offpolicy.train import train

    with pytest.raises(ConfigError, match="env.name='CartPole-v1' has no bounded continuous actions"):
        train(cfg)
    assert not (tmp_path / "run").exists()  # nothing is written for a bad config


@pytest.mark.parametrize("args", [["algo=ppo"], ["algo=sac", "env=CartPole-v1"]])
def test_cli_prints_one_line_and_exits_2(args):
    proc = run_cli(*args, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_help_lists_groups_and_defaults(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert f"algo=: {' | '.join(sorted(ALGOS))}" in out
    assert "profile=: atari | atari_cleanrl | humanoid_scale | local | ray_smoke | scale | scale_rehearsal | smoke" in out
    assert "utd_ratio" in out


def test_a_version_0_checkpoint_composes_in_today_s_keys_and_the_cli_takes_today_s_only(tmp_path):
    """A checkpoint of format version 0 (no ``format_version``; off-policy keys that said "frames" for env steps,
    counters' ``collected_frames``, no ``stop_return_reached``) resumes with today's keys; on the command line the old
    names are unknown keys."""
    from offpolicy.checkpoint import FORMAT_VERSION, MIGRATIONS, Checkpoint
    from offpolicy.progress import Progress
    from shared.checkpoint import save_checkpoint

    assert len(MIGRATIONS) == FORMAT_VERSION  # one migration from each older version
    with pytest.raises(ConfigError, match="unknown key 'total_frames'; did you mean total_env_steps"):
        compose_config(["total_frames=3000"])
    cfg, _ = compose_config(["total_env_steps=3000", "collector.env_steps_per_batch=500",
                             "collector.prefill_env_steps=700", "eval.interval_env_steps=1500",
                             "dqn.eps_anneal_env_steps=900"])
    old = OmegaConf.to_container(cfg)
    old["total_frames"] = old.pop("total_env_steps")
    old["collector"]["frames_per_batch"] = old["collector"].pop("env_steps_per_batch")
    old["dqn"]["eps_anneal_frames"] = old["dqn"].pop("eps_anneal_env_steps")
    del old["dqn"]["dueling"], old["replay"]["frames_once"]
    counters = {"collected_frames": 1000, "optim_steps": 250, "batches": 2, "episodes": 7, "elapsed_s": 3.0}
    path = save_checkpoint(tmp_path / "old.pt", {"config": old, "counters": counters, "learner": {}})
    resumed, checkpoint = compose_config([f"resume={path}", "total_env_steps=6000"])
    assert (resumed.total_env_steps, resumed.collector.env_steps_per_batch, resumed.dqn.eps_anneal_env_steps) == \
        (6000, 500, 900)
    assert "total_frames" not in resumed and "frames_per_batch" not in resumed.collector
    assert resumed.dqn.dueling is False and resumed.replay.frames_once is False  # what version-0 runs used
    assert "sac" not in checkpoint.config  # an algorithm's added keys go to its own section only
    progress = Progress.from_state(checkpoint.counters)
    assert (progress.env_steps, progress.optim_steps, progress.stop_return_reached) == (1000, 250, None)
    assert checkpoint.state["format_version"] == FORMAT_VERSION
    # today's checkpoint reads as it was written
    current = save_checkpoint(tmp_path / "new.pt", {**checkpoint.state, "config": OmegaConf.to_container(resumed)})
    assert Checkpoint.read(current).config["total_env_steps"] == 6000


def test_a_version_1_td3_checkpoint_resumes_as_the_run_it_was(tmp_path):
    """Format version 1 had no uniform prefill: a TD3 checkpoint of it (no ``td3.random_prefill``, no
    ``random_env_steps_left`` in its exploration state) resumes with ``random_prefill`` false and the noisy actor
    collecting, where today's default would prefill uniformly again."""
    from offpolicy_helpers import train_inprocess

    from offpolicy.checkpoint import Checkpoint

    first = train_inprocess("algo=td3", "profile=smoke", "eval.interval_env_steps=0", "eval.final_episodes=0",
                            f"run_dir={tmp_path / 'run'}")
    state = torch.load(first["checkpoint"], weights_only=True)
    assert state["format_version"] == FORMAT_VERSION and int(state["exploration"]["random_env_steps_left"]) == 0
    del state["config"]["td3"]["random_prefill"], state["exploration"]["random_env_steps_left"]
    torch.save({**state, "format_version": 1}, tmp_path / "v1.pt")
    migrated = Checkpoint.read(tmp_path / "v1.pt")
    assert migrated.config["td3"]["random_prefill"] is False
    assert int(migrated.state["exploration"]["random_env_steps_left"]) == 0
    resumed = train_inprocess(f"resume={tmp_path / 'v1.pt'}", "total_env_steps=400", f"run_dir={tmp_path / 'resumed'}")
    assert resumed["status"] == "completed" and resumed["env_steps"] == 400


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, "1"])
def test_a_checkpoint_of_a_newer_format_is_one_error_line_and_exit_2(tmp_path, version, capsys):
    from shared.checkpoint import save_checkpoint
    from shared.config import run_cli as run_entry_point

    cfg, _ = compose_config([])
    counters = {"env_steps": 0, "optim_steps": 0, "batches": 0, "episodes": 0, "elapsed_s": 0.0,
                "stop_return_reached": None}
    path = save_checkpoint(tmp_path / "future.pt", {"format_version": version, "config": OmegaConf.to_container(cfg),
                                                    "counters": counters, "learner": {}})
    with pytest.raises(SystemExit) as exit_info:
        run_entry_point(main, [f"resume={path}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: resume='{path}' has checkpoint format version {version!r}")
    assert f"allowed: format version {FORMAT_VERSION} or older" in err[0]


@pytest.mark.parametrize("name, kind", [("CartPole-v1", "gymnasium"), ("Pong", "atari"), ("ALE/Breakout-v5", "atari"),
                                        ("PongNoFrameskip-v4", "atari"), ("Acrobot-v1", "gymnasium")])
def test_the_env_kind_is_decided_once_when_composing(name, kind):
    """``env.kind`` is read off ``env.name`` when the config is composed; every part of the run reads it from there
    (tests/test_offpolicy_structure.py checks that nothing else reads the kind off the name)."""
    cfg, _ = compose_config(["algo=dqn", f"env={name}"])
    assert cfg.env.kind == kind


def test_a_checkpoint_older_than_env_kind_reads_with_it(tmp_path):
    """A checkpoint written before ``env.kind`` existed: its config gets the kind of its env (the evaluation and
    export CLIs read the checkpoint's config as it is), and a resume composes the same."""
    from omegaconf import OmegaConf

    from offpolicy.checkpoint import Checkpoint
    from shared.checkpoint import save_checkpoint

    cfg, _ = compose_config(["algo=dqn", "env=Pong"])
    old = OmegaConf.to_container(cfg)
    del old["env"]["kind"]
    counters = {"env_steps": 0, "optim_steps": 0, "batches": 0, "episodes": 0, "elapsed_s": 0.0}
    path = save_checkpoint(tmp_path / "old.pt", {"config": old, "counters": counters, "learner": {}})
    assert Checkpoint.read(path).config["env"]["kind"] == "atari"
    resumed, _ = compose_config([f"resume={path}"])
    assert resumed.env.kind == "atari"
