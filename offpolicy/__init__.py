"""The off-policy engine. Importing it changes nothing process-wide: a process that runs the engine's code calls
:func:`prepare_process` where it starts (docs/offpolicy.md, "Processes")."""


def prepare_process() -> None:
    """The process-wide settings of a process that runs the engine's code, applied before it builds anything:
    tensordict's ``from_any`` returns a plain tensor at once instead of searching ``sys.path`` for pandas first
    (shared/compat.py ``fast_from_any``), the fast path of every TensorDictModule call. Called by each process entry:
    ``offpolicy.train``'s ``train`` (the CLI and the Python API), the ``offpolicy.evaluate`` and ``offpolicy.export``
    CLIs, ``offpolicy.tools.plan``, each Ray collector actor and learner rank, the ``collector.overlap`` child and the
    benchmarks that build parts themselves. Idempotent."""
    from shared import compat

    compat.fast_from_any()
