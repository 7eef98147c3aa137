"""scripts/bench_quant.py end to end on the tiny random pair."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_prints_a_call_time_per_precision_and_slot_count() -> None:
    cmd = [sys.executable, "scripts/bench_quant.py", "--model", "tiny_random", "--slots", "1", "3",
           "--repeats", "2", "--threads", "1"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| slots | float32 | bfloat16 | int8 |" in result.stdout
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", result.stdout, re.M)
    assert [slots for slots, _ in rows] == ["1", "3"]
    for _, cells in rows:
        times = [float(x) for cell in cells.split(" | ") for x in cell.split(" / ")]
        assert len(times) == 6 and all(t > 0 for t in times)
