"""What A3C's main process does before its workers start, in process and without workers (fast): the command line
(or the Python API's keywords) is parsed once, and the number of actions comes from ALE's minimal action set of the
game, without a throw-away env, and equals the number the workers' envs have."""
from __future__ import annotations

import sys

import pytest
import torch
from omegaconf import OmegaConf

import shared.config
from shared.atari import AtariBatch, AtariSettings, atari_rom, fire_action, minimal_action_set


def _count_parses(monkeypatch) -> list:
    """Wrap ``parse_overrides`` wherever a loaded module holds it; returns the list of the word lists it was given."""
    calls = []
    real = shared.config.parse_overrides

    def counting(argv, *args, **kwargs):
        calls.append(list(argv))
        return real(argv, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("parse_overrides") is real:
            monkeypatch.setattr(module, "parse_overrides", counting)
    return calls


@pytest.fixture
def runs_recorded(monkeypatch):
    """``a3c.train.train`` replaced by a recorder of the config and checkpoint it is given (no run)."""
    import a3c.train

    runs = []

    def record(cfg, ckpt=None):
        runs.append((cfg, ckpt))
        return {"status": "completed", "error": None}

    monkeypatch.setattr(a3c.train, "train", record)
    return runs


def _smoke_checkpoint(tmp_path):
    from a3c.config import load_config
    from shared.checkpoint import save_checkpoint

    path = tmp_path / "run" / "checkpoints" / "last.pt"
    path.parent.mkdir(parents=True)
    save_checkpoint(path, {"model": {}, "optimizer": {}, "counters": {"frames": 640, "updates": 4, "episodes": 0},
                           "config": OmegaConf.to_container(load_config(["profile=smoke", "workers=1"])),
                           "num_actions": 6})
    return path


@pytest.mark.parametrize("resume", [False, True], ids=["new run", "resume"])
def test_the_command_line_is_parsed_once(resume, tmp_path, monkeypatch, runs_recorded):
    import a3c.train

    ckpt_path = _smoke_checkpoint(tmp_path) if resume else None
    argv = ([f"resume={ckpt_path}"] if resume else ["env=Breakout", "profile=smoke"]) + ["workers=3", "lr=0.001"]
    calls = _count_parses(monkeypatch)
    assert a3c.train.main(argv) == 0
    assert calls == [argv]
    (cfg, ckpt), = runs_recorded
    assert cfg.workers == 3 and cfg.optim.lr == 0.001
    assert cfg.env.name == ("Pong" if resume else "Breakout") and cfg.profile == "smoke"
    assert (ckpt is not None) == resume and (cfg.resume == str(ckpt_path) if resume else cfg.resume is None)
    if resume:
        assert ckpt["counters"]["frames"] == 640 and cfg.run_dir == str(tmp_path / "run")


def test_the_python_api_parses_its_keywords_once(monkeypatch, runs_recorded):
    from a3c.api import train

    calls = _count_parses(monkeypatch)
    assert train(env="Breakout", workers=3, a3c={"t_max": 5}) == {"status": "completed", "error": None}
    assert calls == [["env=Breakout", "workers=3", "a3c.t_max=5"]]
    (cfg, _), = runs_recorded
    assert cfg.env.name == "Breakout" and cfg.workers == 3 and cfg.a3c.t_max == 5


def test_the_main_process_builds_no_env(tmp_path, monkeypatch):
    """A whole ``a3c.train`` run whose pool starts no workers: the main process never constructs an AtariVectorEnv
    (before the workers would start or after), and the model and checkpoint still have Pong's 6 actions."""
    import ale_py.vector_env

    import a3c.train
    from a3c.api import train
    from a3c.supervisor import WorkerPool

    built, at_start = [], []

    class CountedVectorEnv(ale_py.vector_env.AtariVectorEnv):
        def __init__(self, game, *args, **kwargs):
            built.append(game)
            super().__init__(game, *args, **kwargs)

    class NoWorkers(WorkerPool):
        def start(self) -> None:
            at_start.append(list(built))  # no worker or evaluator: every poll then finds all (none) finished

    monkeypatch.setattr(ale_py.vector_env, "AtariVectorEnv", CountedVectorEnv)
    monkeypatch.setattr(a3c.train, "WorkerPool", NoWorkers)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run sets both for its workers; restored after the test
    threads = torch.get_num_threads()
    try:
        summary = train(profile="smoke", run_dir=tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert summary["status"] == "completed" and summary["frames"] == 0
    assert at_start == [[]] and built == []
    ckpt = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["num_actions"] == 6 and ckpt["model"]["policy_head.weight"].shape[0] == 6


@pytest.mark.parametrize("game, actions", [("Pong", 6), ("Breakout", 4), ("MontezumaRevenge", 18),
                                           ("TicTacToe3d", 10)])
def test_the_main_process_action_count_is_the_workers(game, actions):
    """The main process's count (ALE's minimal action set) against a worker's env, for games of 4, 6 and all 18
    actions; the names are the ones ale_py's AtariEnv gives, so FIRE's index is too. TicTacToe3d (Gymnasium's id is
    ``ALE/TicTacToe3D-v5``) resolves in either case: its FIRE index needs no Gymnasium env."""
    from ale_py.env import AtariEnv

    rom = atari_rom(game)
    env = AtariBatch(AtariSettings(name=game), num_envs=1, seed=0)
    try:
        assert len(minimal_action_set(rom)) == env.num_actions == actions
    finally:
        env.close()
    reference = AtariEnv(game=rom)
    try:
        assert list(minimal_action_set(rom)) == reference.get_action_meanings()
    finally:
        reference.close()
    assert fire_action(rom) == minimal_action_set(rom).index("FIRE")
