"""Learning-curve PNGs drawn from a run's CSV metrics."""
from __future__ import annotations

from pathlib import Path

from shared.logging import read_scalars


def plot_curves(run_dir: str | Path, series: dict[str, str], *, title: str, xlabel: str = "frames",
                out_name: str = "curves.png", smooth: int = 20) -> Path | None:
    """Plot each ``label -> metric`` (raw and a moving average) into ``run_dir/out_name``; None if nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = False
    for label, metric in series.items():
        steps, values = read_scalars(run_dir, metric)
        if not steps:
            continue
        drawn = True
        line, = ax.plot(steps, values, alpha=0.3 if len(values) > smooth else 1.0, marker="" if len(values) > 1 else "o")
        if len(values) > smooth:
            kernel = np.ones(smooth) / smooth
            ax.plot(steps[smooth - 1:], np.convolve(values, kernel, mode="valid"), color=line.get_color(),
                    label=f"{label} (mean of {smooth})")
        else:
            line.set_label(label)
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel(xlabel)
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    out = Path(run_dir) / out_name
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
