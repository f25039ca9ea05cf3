"""The off-policy engine. Importing it makes tensordict's ``from_any`` skip its per-tensor ``find_spec`` search
(shared/compat.py) in every process that runs our code: the training process, the evaluator, the benchmarks and each
Ray actor (which imports this package when it unpickles its class)."""
from shared import compat

compat.fast_from_any()
