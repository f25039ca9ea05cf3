"""Evaluation helpers shared by the engines: return statistics, mp4 writing, and the frame of both ``evaluate``
CLIs (arguments from the engine's ``evaluate.yaml``, the output directory, ``evaluation.json`` and its line)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np


def return_stats(returns: Sequence[float]) -> dict[str, float]:
    """Mean, std, min and max of episode returns."""
    arr = np.asarray(returns, dtype=np.float64)
    return {"return": float(arr.mean()), "return_std": float(arr.std()), "return_min": float(arr.min()),
            "return_max": float(arr.max()), "episodes": float(arr.size)}


def write_video(path: str | Path, frames: Sequence[np.ndarray], fps: int = 30) -> Path:
    """Write ``[H, W]`` grey or ``[H, W, 3]`` RGB uint8 frames to an mp4 (imageio-ffmpeg ships its own ffmpeg)."""
    try:
        import imageio.v2 as imageio
    except ImportError as exc:  # the video extra is optional
        raise RuntimeError("video needs the video extra: pip install -e '.[video]'") from exc
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=1) as writer:
        for frame in frames:
            writer.append_data(np.ascontiguousarray(frame))
    return path


def evaluate_cli_args(config: type, header: str, usage: str, argv: list[str], written_by: str):
    """The arguments of an ``evaluate`` (or ``export``) CLI: the keys ``config`` declares (shared/schema.py) with
    ``key=value`` overrides (``checkpoint`` required); ``None`` after printing the reference (``header`` and the
    commented keys) for ``--help``. Bad input is a ConfigError (one line, exit 2)."""
    from shared import schema
    from shared.config import ConfigError, compose, help_text, parse_overrides

    if {"-h", "--help"} & set(argv):
        print(help_text(schema.to_yaml(config, header), usage, {}))
        return None
    args = compose(schema.defaults(config), parse_overrides(argv), rules=schema.rules(config))
    if not args.checkpoint:
        raise ConfigError(f"checkpoint is required; allowed: the path of a checkpoint written by {written_by}")
    return args


def evaluation_dir(args) -> Path:
    """Where an ``evaluate`` CLI writes (created; a ConfigError naming ``run_dir`` if it cannot be): ``run_dir``, or
    the run directory of the checkpoint (``<run>/checkpoints/last.pt``); call it once the checkpoint has loaded."""
    from shared.config import ensure_writable_dir

    return ensure_writable_dir(args.run_dir or Path(args.checkpoint).resolve().parent.parent, "run_dir")


def write_evaluation(out_dir: Path, result: dict, what: str) -> None:
    """Write ``result`` (with :func:`return_stats`' keys) to ``out_dir/evaluation.json`` and print its line:
    ``return: mean +- std over N <what>``."""
    (Path(out_dir) / "evaluation.json").write_text(json.dumps(result, indent=2))
    video = f"; video: {result['video']}" if result.get("video") else ""
    print(f"return: {result['return']:.2f} +- {result['return_std']:.2f} over {int(result['episodes'])} {what}{video}")
