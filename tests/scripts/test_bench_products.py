"""scripts/bench_products.py end to end on one row count."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.scripts.conftest import REPO


def test_prints_both_products_per_shape_and_their_agreement(script) -> None:
    shapes = script("bench_products").SHAPES
    cmd = [sys.executable, "scripts/bench_products.py", "--rows", "3", "--hot",
           "--repeats", "2", "--calls", "2", "--threads", "1"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    diffs = re.findall(r"^(.+): max \|few rows − torch\| (\S+)$", result.stdout, re.M)
    assert [name for name, _ in diffs] == [
        f"{name} ({out} × {inp}), 3 rows" for name, (out, inp) in shapes.items()
    ]
    assert all(float(d) < 1e-4 for _, d in diffs)  # the same product within fp32 rounding
    rows = re.findall(r"^\| ([^|]+ rows) \| (.+) \| (.+) \| (\S+)× \|$", result.stdout, re.M)
    assert [name for name, *_ in rows] == [name for name, _ in diffs]
    for _, one_dnn, few, ratio in rows:
        times = [float(x) for cell in (one_dnn, few) for x in cell.split(" / ")]
        assert len(times) == 4 and all(t > 0 for t in times) and float(ratio) > 0


def test_refuses_a_row_count_it_does_not_take() -> None:
    cmd = [sys.executable, "scripts/bench_products.py", "--rows", "9"]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "--rows are 1 to 8, not [9]" in result.stderr
