"""scripts/bench_processes.py end to end: whole translate processes side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "scripts/bench_processes.py", "--rounds", "2", "--out", str(tmp_path),
           *args, "model=tiny_random", "hardware.threads=1"]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_compares_runs_of_two_checkouts_on_one_line(tmp_path: Path) -> None:
    result = run(tmp_path, "--line", "Hola", "--run", "base=decoding=beam",
                 "--checkout", f"base={REPO}", "--run", "this=", "--compare", "this/base")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "processes.json").read_text())
    assert [r["run"] for r in summary["runs"]] == ["base", "this"]
    assert all(len(r["walls"]) == 2 and r["bleu"] is None for r in summary["runs"])
    (comparison,) = summary["comparisons"]
    assert comparison["comparison"] == "this/base"
    assert comparison["same_lines"] == comparison["lines"] == 1  # exact: same line
    assert (tmp_path / "processes.png").stat().st_size > 0
    assert "| this/base |" in (tmp_path / "processes.md").read_text()


def test_scores_test_verses_against_their_references(tmp_path: Path) -> None:
    result = run(tmp_path, "--limit", "2", "--run", "beam=decoding=beam", "--run",
                 "greedy=decoding=greedy", "--compare", "greedy/beam")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "processes.json").read_text())
    assert all(r["bleu"] is not None for r in summary["runs"])
    assert summary["bleu_signature"].startswith("nrefs:1")
    assert summary["comparisons"][0]["lines"] == 2


def test_a_comparison_must_name_runs(tmp_path: Path) -> None:
    result = run(tmp_path, "--line", "Hola", "--run", "a=", "--compare", "a/b")
    assert result.returncode != 0
    assert "'b' names no run" in result.stderr
