"""Session-wide test settings. Every Ray cluster this test session starts (in this process or in a run it starts)
keeps its files under a temporary directory of its own (``RAY_TMPDIR``, which Ray reads), so the tests that check that
no Ray process is left behind look at this session's Ray processes only, never at another Ray job on the machine."""
from __future__ import annotations

import os
import shutil
import tempfile

# short: Ray's socket paths under it must stay within the 107 bytes of a Unix socket name
RAY_TMPDIR = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")
os.environ["RAY_TMPDIR"] = RAY_TMPDIR


def pytest_unconfigure(config):
    shutil.rmtree(RAY_TMPDIR, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """Each failed test's reason in full at the end of the run (pytest's own short summary cuts it to the terminal's
    width, which left nothing after a long test id in CI's log)."""
    failed = [*terminalreporter.stats.get("failed", []), *terminalreporter.stats.get("error", [])]
    if not failed:
        return
    terminalreporter.write_sep("=", "why each test failed")
    for report in failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = " ".join(str(crash.message if crash is not None else report.longrepr).split())
        where = f" ({crash.path}:{crash.lineno})" if crash is not None else ""
        terminalreporter.write_line(f"{report.nodeid}{where}: {reason[:600]}")
