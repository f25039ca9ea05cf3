"""Checkpoints are atomic and weights-only; a JSON-lines record replaces its own line, also beside a concurrent
writer; loggers write every backend; non-finite metrics are refused."""
import json
import multiprocessing
import os

import pytest
import torch

from shared.checkpoint import load_checkpoint, save_checkpoint
from shared.config import ConfigError
from shared.files import read_jsonl, replace_jsonl_line
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


def test_a_record_replaces_the_line_of_its_key_and_the_others_keep_their_order(tmp_path):
    path = tmp_path / "results" / "case.jsonl"
    replace_jsonl_line(path, {"seed": 1, "value": "first"}, key="seed")
    replace_jsonl_line(path, {"seed": 0, "value": "first"}, key="seed")
    replace_jsonl_line(path, {"seed": 1, "value": "again"}, key="seed")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"seed": 1, "value": "again"}, {"seed": 0, "value": "first"}]
    assert sorted(os.listdir(path.parent)) == ["case.jsonl", "case.jsonl.lock"]  # no temp file left
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(ValueError, match="case.jsonl:3 is not JSON"):
        read_jsonl(path)


def _write_records(path, seeds: range) -> None:
    for seed in seeds:
        replace_jsonl_line(path, {"seed": seed, "padding": "x" * 2_000}, key="seed")


def test_writers_of_other_seeds_at_once_lose_no_record(tmp_path):
    """Two writers add 100 records each to one file: without the lock, a writer's read-modify-write would drop the
    lines the other added meanwhile."""
    path = tmp_path / "case.jsonl"
    context = multiprocessing.get_context("fork")
    writers = [context.Process(target=_write_records, args=(path, range(first, 200, 2))) for first in (0, 1)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    assert [writer.exitcode for writer in writers] == [0, 0]
    assert sorted(r["seed"] for r in read_jsonl(path)) == list(range(200))


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
