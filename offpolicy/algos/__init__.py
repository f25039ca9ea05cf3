"""The off-policy algorithms, one module each (``dqn``, ``c51``, ``sac``, ``td3``, ``ddpg``, ``crossq``, ``redq``),
found by name. Each module declares ``ALGORITHM`` (base.py: name, action-space kind, config section, smoke env,
builder); its config file ``configs/offpolicy/algo/<name>.yaml`` sets the common keys it changes. Adding an algorithm
is adding those two files: its builder returns every form of its policies the engine uses (``AlgoParts``: collection,
evaluation, evaluation on plain tensors for the export), so no other module picks a form by the policy's class.

Where the parts run (in this process or on Ray) is the engine's job (offpolicy/engines/).
"""
from __future__ import annotations

import importlib
import pkgutil

from offpolicy.algos.base import AlgoParts, Algorithm

_SHARED = {"base", "networks", "policies"}  # modules of this package that are not algorithms
ALGORITHMS: dict[str, Algorithm] = {
    module.ALGORITHM.name: module.ALGORITHM
    for module in (importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
                   if info.name not in _SHARED)
}
ALGOS = tuple(ALGORITHMS)
DEFAULT_ALGO = "dqn"  # what a run without algo= trains


def algorithm(name: str) -> Algorithm:
    """The algorithm called ``name`` (a name the config check has accepted)."""
    return ALGORITHMS[name]



__all__ = ["ALGORITHMS", "ALGOS", "DEFAULT_ALGO", "AlgoParts", "Algorithm", "algorithm"]
