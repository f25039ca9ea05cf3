"""What a run that starts child processes with ``spawn`` needs of the script that started it.

A spawned child imports the parent's ``__main__`` module again (multiprocessing's "safe importing of main module"): a
script that starts a run at its top level, without ``if __name__ == "__main__":``, starts it again in every child,
which then fails with a long multiprocessing traceback and no word of the cause. :func:`check_main_guard` says so in
one line before any child is started.
"""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from shared.config import ConfigError


def _guarded_lines(tree: ast.Module) -> list[tuple[int, int]]:
    """The line ranges of the top-level ``if __name__ == "__main__":`` blocks of a module."""
    ranges = []
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
                and {ast.unparse(test.left), ast.unparse(test.comparators[0])} in
                ({"__name__", "'__main__'"}, {"__name__", '"__main__"'})):
            ranges.append((node.lineno, node.end_lineno or node.lineno))
    return ranges


def unguarded_main_line() -> tuple[str, int] | None:
    """``(script, line)`` when the calling code runs at the top level of a ``__main__`` script outside an ``if
    __name__ == "__main__":`` block (a spawned child would run it again); None otherwise (``python -m``, an
    interactive session or notebook, a guarded call, a call from inside a function the script defines and calls
    under its guard)."""
    frame = inspect.currentframe()
    top = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            top = frame
        frame = frame.f_back
    if top is None:
        return None
    path = Path(top.f_code.co_filename)
    if not path.is_file() or top.f_globals.get("__spec__") is not None:  # python -c / a REPL / python -m module
        return None
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    line = top.f_lineno
    if any(start <= line <= end for start, end in _guarded_lines(tree)):
        return None
    return str(path), line


def check_main_guard(what: str) -> None:
    """Raise ConfigError (one line) when ``what`` (a run that spawns children) is started from the top level of a
    script without ``if __name__ == "__main__":``, before any child is started."""
    found = unguarded_main_line()
    if found is not None:
        script, line = found
        raise ConfigError(f"{what} was started at line {line} of {script} outside an `if __name__ == \"__main__\":` "
                          "block; its child processes are spawned and import the script again, which would start "
                          "the run again in each of them; allowed: the call inside `if __name__ == \"__main__\":`")
