"""scripts/step_account.py end to end on the tiny untrained pair, at the smallest sizes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts.conftest import REPO


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("account")
    cmd = [sys.executable, "scripts/step_account.py", "--model", "tiny_random",
           "--sentences", "1", "--gen-len", "3", "--repeats", "2", "--calls", "1",
           "--threads", "1", "--bandwidth-mb", "16", "--gemm", "128", "--out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, out


def test_a_table_per_call_kind_with_every_part_and_both_floors(script, run) -> None:
    stdout, out = run
    parts = script("step_account").PARTS
    assert "`lscpu`: " in stdout
    titles = re.findall(r"^### tiny_random, float32: (.+?), \d+ rows", stdout, re.M)
    assert titles == ["plain beam step", "verification pass"]
    for table in stdout.split("### ")[1:]:
        names = re.findall(r"^\| \((\w)\) ([^|]+?) \|", table, re.M)
        assert names == [("a", "whole step, as the generator runs it"),
                         *zip("bcdef", parts, strict=True)]  # fmt: skip
        floors = re.findall(
            r"^\| (memory|compute): .+ \| (\S+) \| (\S+)× / (\S+)× \|$", table, re.M
        )
        assert [f[0] for f in floors] == ["memory", "compute"]
        assert all(float(x) > 0 for _, *values in floors for x in values)
    assert (out / "step_account_tiny_random.md").read_text().strip() == stdout.strip()
    assert (out / "step_account_tiny_random.png").stat().st_size > 0


def test_the_parts_add_up_to_the_step(script, run) -> None:
    _, out = run
    parts = script("step_account").PARTS
    record = json.loads((out / "step_account_tiny_random.json").read_text())
    assert [a["kind"] for a in record["accounts"]] == ["plain beam step", "verification pass"]
    for account in record["accounts"]:
        assert account["shape"]["rows"] >= account["shape"]["k"] == 5
        assert len(account["samples_ms"]["step"]) == 2
        for column in (account["min_ms"], account["median_ms"]):
            assert sum(column[p] for p in parts) == pytest.approx(column["step"])
            assert all(column[p] > 0 for p in ("products", "attention", "log-softmax + top-k"))
        assert account["read_bytes"] > account["weight_bytes"] > 0
        assert all(ms > 0 for ms in account["floors_ms"].values())
