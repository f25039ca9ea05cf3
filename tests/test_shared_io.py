"""Checkpoints are atomic and weights-only; loggers write every backend; non-finite metrics are refused."""
import os

import pytest
import torch

from shared.checkpoint import load_checkpoint, save_checkpoint
from shared.config import ConfigError
from shared.logging import make_logger, read_scalars


class NotWeights:
    """An arbitrary object: unpickling it could run code, so weights_only loading must refuse it."""


def test_checkpoint_roundtrip_and_weights_only(tmp_path):
    path = save_checkpoint(tmp_path / "c" / "last.pt", {"w": torch.arange(3.0), "counters": {"frames": 7}})
    assert load_checkpoint(path)["counters"] == {"frames": 7}

    torch.save({"obj": NotWeights()}, tmp_path / "evil.pt")
    with pytest.raises(ConfigError, match="is not a checkpoint or is damaged .*Weights only load failed"):
        load_checkpoint(tmp_path / "evil.pt")
    with pytest.raises(ConfigError, match="no such file"):
        load_checkpoint(tmp_path / "missing.pt")


def test_failed_write_keeps_the_old_checkpoint_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "last.pt", {"version": 1})

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        save_checkpoint(path, {"version": 2})
    monkeypatch.undo()
    assert load_checkpoint(path) == {"version": 1}
    assert os.listdir(tmp_path) == ["last.pt"]


@pytest.mark.parametrize("backend", ["csv", "tensorboard", "wandb"])
def test_every_backend_writes_and_csv_is_always_kept(tmp_path, backend, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"lr": 0.1, "env": {"name": "Pong", "hidden": [256, 256]}, "resume": None}  # nested, like the engines'
    logger = make_logger(backend, tmp_path, rank=0, config=config)
    logger.log({"train/return": -21.0, "loss/critic": 0.5}, step=100)
    logger.log({"train/return": -20.0}, step=200)
    logger.close()
    assert read_scalars(tmp_path, "train/return") == ([100.0, 200.0], [-21.0, -20.0])
    if backend == "tensorboard":
        assert list((tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    if backend == "wandb":
        assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_non_finite_metrics_are_refused(tmp_path):
    logger = make_logger("csv", tmp_path)
    with pytest.raises(FloatingPointError, match="loss/critic"):
        logger.log({"loss/critic": float("nan")}, step=1)
    logger.close()
