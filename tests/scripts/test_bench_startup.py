"""scripts/bench_startup.py end to end: two checkouts' translate processes side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_times_both_checkouts_and_checks_their_outputs_agree() -> None:
    cmd = [sys.executable, "scripts/bench_startup.py", "--baseline", str(REPO), "--repeats", "1",
           "model=tiny_random", "hardware.threads=1"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "outputs: identical in every process" in result.stdout
    assert result.stdout.count("baseline") >= 1 and "candidate" in result.stdout
