"""Checkpoints: atomic writes (through shared/files.py) and ``weights_only`` loads."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shared.files import atomic_write


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``path`` atomically: a reader sees the old file or the new one, never a partial one."""
    with atomic_write(path) as f:
        torch.save(state, f)
    return Path(path)


def resumed_seed(seed: int, frames: int) -> int:
    """The env seed of a run (re)started at ``frames``: ``seed`` itself for a new run, and for a resumed one a seed
    derived from both, so the resumed run does not replay the first run's no-op starts and episodes."""
    if frames == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, frames]).generate_state(1)[0] % 2**31)


def load_checkpoint(path: str | Path, *, key: str = "resume", required: tuple[str, ...] = (),
                    written_by: str = "this entry point", format_version: int | None = None) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (tensors, containers and plain Python values only).

    Whatever is wrong with the file (missing, a directory, unreadable, not a checkpoint, truncated, lacking the
    ``required`` top-level keys, as a checkpoint of the other engine does, or, given the reader's ``format_version``,
    of a newer format, written by newer code) is one ConfigError naming ``key``. A file without ``format_version`` is
    version 0; the caller brings an older format to its own.
    """
    from shared.config import ConfigError

    path = Path(path)
    where = f"{key}={str(path)!r}"
    if not path.exists():
        raise ConfigError(f"{where}: no such file; allowed: a checkpoint written by {written_by}")
    if not path.is_file():
        raise ConfigError(f"{where} is not a file; allowed: a checkpoint file written by {written_by}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read ({exc.strerror or exc}); allowed: a readable checkpoint") from None
    except Exception as exc:  # torch raises several types for a corrupt, truncated or foreign file
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ConfigError(f"{where} is not a checkpoint or is damaged ({type(exc).__name__}: {reason}); allowed: "
                          f"a complete checkpoint written by {written_by}") from None
    missing = [k for k in required if not isinstance(state, dict) or k not in state]
    if missing:
        raise ConfigError(f"{where} is not a checkpoint of {written_by} (it lacks {', '.join(missing)}); allowed: "
                          f"a checkpoint written by {written_by}")
    version = state.get("format_version", 0)
    if format_version is not None and not (isinstance(version, int) and 0 <= version <= format_version):
        raise ConfigError(f"{where} has checkpoint format version {version!r}, which this code does not read (newer "
                          f"code wrote it); allowed: format version {format_version} or older, as {written_by} here "
                          "writes")
    return state


def resumed_config(config: dict, checkpoint_path: str | Path) -> dict:
    """A checkpoint's config as the base of its resume: the run continues in the run directory the checkpoint lies
    in (``<run>/checkpoints/last.pt``), so a moved or copied run writes where it is now, not where it was made."""
    path = Path(checkpoint_path).resolve()
    if path.parent.name != "checkpoints":
        return config
    return {**config, "run_dir": str(path.parent.parent)}
