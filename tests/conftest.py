"""Session-wide test settings: every Ray cluster this test session starts (in this process or in a run it starts)
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
