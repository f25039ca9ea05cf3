"""Metric logging on torchrl's loggers. Call :func:`make_logger` inside the process that logs: loggers hold open
files and sockets and must never be pickled into another process."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from shared.config import ConfigError

BACKENDS = ("csv", "tensorboard", "wandb")
LOG_SUBDIR = "logs"


class MetricLogger:
    """Fans ``namespace/name`` scalars out to a CSV logger (always: the curves are drawn from it) and optionally a
    TensorBoard or W&B logger. torchrl has no multi-backend logger, hence this small class."""

    def __init__(self, loggers: list):
        self._loggers = loggers

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log finite scalars at ``step``; non-finite values are rejected loudly, never written silently."""
        bad = {k: v for k, v in metrics.items() if not math.isfinite(float(v))}
        if bad:
            raise FloatingPointError(f"non-finite metrics at step {step}: {bad}")
        for logger in self._loggers:
            logger.log_metrics(metrics, step=step)

    def close(self) -> None:
        for logger in self._loggers:
            logger.close()
            for f in getattr(logger.experiment, "files", {}).values():  # CSVLogger keeps its files open
                f.close()


def check_logger_backend(backend: str) -> None:
    """``logger.backend`` can start here, checked before a run starts (A3C creates its logger in worker 0, where a
    failure would only show as a dead worker): wandb needs the package and an API key (``wandb login``,
    ``WANDB_API_KEY``) unless ``WANDB_MODE`` is offline or disabled. A ConfigError otherwise."""
    if backend != "wandb":
        return
    import importlib.util
    import netrc

    if importlib.util.find_spec("wandb") is None:
        raise ConfigError("logger.backend=wandb needs the wandb package; allowed: csv, tensorboard, or pip install "
                          "wandb")
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return
    try:
        logged_in = netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        logged_in = False
    if not logged_in:
        raise ConfigError("logger.backend=wandb has no API key here; allowed: csv, tensorboard, or wandb after "
                          "`wandb login` (or WANDB_API_KEY=..., or WANDB_MODE=offline)")


def make_logger(backend: str, run_dir: str | Path, *, rank: int = 0, config: dict | None = None) -> MetricLogger:
    """Create the run's logger in the calling process; records which process owns it in ``logs/owner.json``."""
    from torchrl.record.loggers import CSVLogger, TensorboardLogger, WandbLogger

    if backend not in BACKENDS:
        raise ValueError(f"logger backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    run_dir = Path(run_dir)
    loggers = [CSVLogger(exp_name=LOG_SUBDIR, log_dir=str(run_dir))]
    if backend == "tensorboard":
        loggers.append(TensorboardLogger(exp_name=LOG_SUBDIR, log_dir=str(run_dir / "tensorboard")))
    elif backend == "wandb":
        try:
            loggers.append(
                WandbLogger(exp_name=run_dir.name, save_dir=str(run_dir), project="rlstack",
                            offline=os.environ.get("WANDB_MODE") == "offline", log_env_packages=False)
            )
        except Exception as exc:  # wandb's own errors (no key, no network) have no common public base class
            raise ConfigError(f"logger.backend=wandb cannot start ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); allowed: csv, tensorboard") from None
    if config is not None:
        for logger in loggers[1:]:
            logger.log_hparams(flat_hparams(config))
    owner = run_dir / LOG_SUBDIR / "owner.json"
    owners = json.loads(owner.read_text()) if owner.exists() else []
    owners.append({"pid": os.getpid(), "rank": rank})
    owner.write_text(json.dumps(owners))
    return MetricLogger(loggers)


def flat_hparams(tree: dict, prefix: str = "") -> dict:
    """A nested config as flat ``a.b -> scalar`` pairs: TensorBoard's hparams take no nesting, lists or None."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def read_scalars(run_dir: str | Path, name: str) -> tuple[list[float], list[float]]:
    """Read one CSV metric (``train/return``) of a run directory back as ``(steps, values)``; empty lists if it was
    never logged (shared.plots.read_curve also reads what a results copy keeps)."""
    path = Path(run_dir) / LOG_SUBDIR / "scalars" / f"{name}.csv"
    steps: list[float] = []
    values: list[float] = []
    if path.exists():
        for line in path.read_text().splitlines():
            step, value = line.split(",")
            steps.append(float(step))
            values.append(float(value))
    return steps, values
