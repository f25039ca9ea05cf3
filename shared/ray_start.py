"""Start Ray the project's way, for every part that uses it (the off-policy Ray engine, the tuning tool's Ray
workers): a local cluster bound to 127.0.0.1 with no dashboard, or the running cluster at an address."""
from __future__ import annotations

from shared import compat
from shared.config import ConfigError


def init_ray(address: str | None, *, address_key: str, needed_by: str, instead: str, log_to_driver: bool = False,
             **local_resources) -> None:
    """``ray.init`` of a local cluster (``local_resources``: its ``num_cpus``, ``num_gpus``) when ``address`` is None,
    else attach to ``address``. Without Ray installed, or when the address cannot be reached, a ConfigError: one line
    naming ``needed_by`` (``engine=ray``) and what to use ``instead``, or the ``address_key``."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{needed_by} needs Ray; allowed: {instead}, or install it: pip install -e '.[ray]'") from None
    kwargs = {"include_dashboard": False, "log_to_driver": log_to_driver, "configure_logging": False}
    if address is None:
        compat.ray_single_machine_mode()
        kwargs.update(local_resources)
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"{address_key}={address!r}: cannot connect ({str(exc).splitlines()[0]}); allowed: null "
                          "(start a local Ray), auto or host:port of a running cluster") from None
