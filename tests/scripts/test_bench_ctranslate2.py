"""scripts/bench_ctranslate2.py --quick: every engine in its own process, the table, the
JSON and the plot written, fairseq2's own rows identical to themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed (the compare extra)")


def test_quick_run_writes_the_table(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "scripts/bench_ctranslate2.py"), "--quick", "--out", str(tmp_path)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "ct2.json").read_text())
    assert summary["sentences"] == 4 and summary["repeats"] == 1
    assert set(summary["results"]) == {"batch 1", "batch 16", "1,024 tokens"}
    for rows in summary["results"].values():
        assert {"CTranslate2 float32", "CTranslate2 int8", "CTranslate2 int8_float32"} <= set(rows)
        assert rows["fairseq2 beam"]["identical_to_fairseq2"] == 4
        assert rows["specbeam spec_beam"]["identical_to_fairseq2"] == 4  # exact
        assert all(r["min_seconds"] > 0 for r in rows.values())
    assert "| batch 1 | CTranslate2 int8 |" in (tmp_path / "ct2.md").read_text()
    assert (tmp_path / "ct2.png").stat().st_size > 0
