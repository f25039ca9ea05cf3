"""What A3C's main process does before its workers start, in process and without workers (fast): the command line
(or the Python API's keywords) is parsed once."""
from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

import shared.config


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
    from a3c import train

    calls = _count_parses(monkeypatch)
    assert train(env="Breakout", workers=3, a3c={"t_max": 5}) == {"status": "completed", "error": None}
    assert calls == [["env=Breakout", "workers=3", "a3c.t_max=5"]]
    (cfg, _), = runs_recorded
    assert cfg.env.name == "Breakout" and cfg.workers == 3 and cfg.a3c.t_max == 5
