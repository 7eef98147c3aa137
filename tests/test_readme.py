"""The README's commands and example, as a new user meets them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


def test_the_python_example_runs_as_written_from_any_directory(tmp_path) -> None:
    (example,) = blocks("python")
    script = tmp_path / "example.py"
    script.write_text(example)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    translation, stats = result.stdout.strip().splitlines()[-2:]
    assert translation == "In the beginning God created the heaven and earth."
    assert re.fullmatch(r"τ \d\.\d\d: \d+ beam-search steps in \d+ target calls", stats)


def test_ci_runs_the_readme_test_command() -> None:
    test_command = blocks("bash")[0].splitlines()[0]
    assert "pytest" in test_command
    assert test_command in (REPO / ".ci" / "run").read_text()
