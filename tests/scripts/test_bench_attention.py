"""scripts/bench_attention.py end to end on small shapes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_prints_both_kernels_per_shape_and_their_agreement() -> None:
    cmd = [sys.executable, "scripts/bench_attention.py", "--sources", "2", "--prefix", "3", "7",
           "--repeats", "2", "--calls", "2", "--threads", "1"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    diffs = re.findall(r"^(.+): max \|kernel − SDPA\| (\S+)$", result.stdout, re.M)
    assert [name for name, _ in diffs] == ["self, S=2, t=3", "self, S=2, t=7", "cross, S=2"]
    assert all(float(d) < 1e-5 for _, d in diffs)  # the same attention within fp32 rounding
    rows = re.findall(
        r"^\| ((?:self|cross)[^|]+) \| (.+) \| (.+) \| (\S+)× \|$", result.stdout, re.M
    )
    assert [name for name, *_ in rows] == [name for name, _ in diffs]
    for _, sdpa, kernel, ratio in rows:
        times = [float(x) for cell in (sdpa, kernel) for x in cell.split(" / ")]
        assert len(times) == 4 and all(t > 0 for t in times) and float(ratio) > 0
