"""The integration example runs and delivers every expired session exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "expired_sessions.py"


def test_expired_sessions_example() -> None:
    result = subprocess.run([sys.executable, str(EXAMPLE), "--members", "400",
                             "--seconds", "30"], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every expiry delivered exactly once" in result.stdout
    assert "congestion retries" in result.stdout
