"""Evaluation helpers shared by the engines: return statistics and mp4 writing."""
from __future__ import annotations

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
