"""tests/broken_copies.sh breaks one line per case and expects a test to
fail; a case whose line has since moved or changed no longer breaks anything.
This checks, in seconds, that every case's edit still applies (the full
script is not part of the suite: each case is a pytest run of its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_broken_copy_still_applies_its_edit():
    # Execute: the dry mode checks each case's line occurs once, changes nothing
    out = subprocess.run(
        ["bash", str(ROOT / "tests" / "broken_copies.sh")],
        cwd=ROOT,
        env={"BROKEN_DRY": "1", "PY": sys.executable, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Assert: every case named, none stale
    lines = out.stdout.splitlines()
    stale = [line for line in lines if not line.endswith(": applies")]
    assert stale == [] and out.returncode == 0, out.stdout + out.stderr
    assert len(lines) >= 40
