"""The suite's own report: a failing test's reason is printed in full in the run's last lines (tests/conftest.py),
so a red CI log says why without scrolling, however long the test's id."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("columns", ["80", "300"])  # CI's terminal is wide: pytest's own summary then holds it too
def test_a_failure_s_reason_is_in_the_last_lines(tmp_path, columns):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_failing.py").write_text(
        "def test_" + "a_long_name_" * 12 + "that_fails():\n"
        "    assert 1 + 1 == 3, 'the sum is wrong: ' + 'x' * 150\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          # without the outer run's PYTEST_ADDOPTS (--durations would print after the section)
                          env={**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "COLUMNS": columns})
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    # Our section's one line; pytest's own short summary may also hold the reason when the terminal is wide (CI).
    [header] = [i for i, line in enumerate(lines) if "why each test failed" in line]
    assert len(lines) - header <= 6, "the section is not among the last lines"
    line = lines[header + 1]
    assert "that_fails" in line and "AssertionError" in line
    assert "test_failing.py:2" in line and "the sum is wrong: " + "x" * 150 in line
