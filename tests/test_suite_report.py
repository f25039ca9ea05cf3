"""The suite's own report: a failing test's reason is printed in full in the run's last lines (tests/conftest.py),
so a red CI log says why without scrolling, however long the test's id."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def test_a_failure_s_reason_is_in_the_last_lines(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_failing.py").write_text(
        "def test_" + "a_long_name_" * 12 + "that_fails():\n"
        "    assert 1 + 1 == 3, 'the sum is wrong: ' + 'x' * 150\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    tail = proc.stdout.strip().splitlines()[-6:]
    [line] = [line for line in tail if "that_fails" in line and "AssertionError" in line]
    assert "test_failing.py:2" in line and "the sum is wrong: " + "x" * 150 in line
