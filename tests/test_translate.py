"""End to end: the Hydra app, one output line per input line, speculative == plain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINES = [
    "En el principio crió Dios los cielos y la tierra.",
    "",
    "Y dijo Dios: Sea la luz: y fué la luz.",
    "   ",
    "Y vió Dios que la luz era buena.",
]


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", f"hydra.run.dir={tmp_path}/hydra", *overrides]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def source_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "src.es"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def test_speculative_output_equals_beam_search(tmp_path, source_file) -> None:
    outputs = {}
    for decoding in ("beam", "spec_beam"):
        out = tmp_path / f"{decoding}.en"
        stats = tmp_path / f"{decoding}.jsonl"
        result = run(
            tmp_path,
            f"decoding={decoding}",
            f"input={source_file}",
            f"output={out}",
            f"stats_file={stats}",
        )
        assert result.returncode == 0, result.stderr
        outputs[decoding] = out.read_text(encoding="utf-8").split("\n")[:-1]
        records = [json.loads(line) for line in stats.read_text().splitlines()]
        assert [r["line"] for r in records] == [1, 3, 5]
    assert len(outputs["beam"]) == len(LINES)
    assert outputs["beam"] == outputs["spec_beam"]
    assert outputs["beam"][1] == "" and outputs["beam"][3] == ""
    assert all(outputs["beam"][i] for i in (0, 2, 4))


def test_stdin_to_stdout_and_clear_errors(tmp_path) -> None:
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "decoding.max_gen_len=[0.5,4]",
           f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    result = subprocess.run(
        cmd, cwd=REPO, input="Hola.\n\n", capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split("\n")) == 3 and result.stdout.split("\n")[1] == ""

    bad = run(tmp_path, "decoding.gamma=0")
    assert bad.returncode != 0 and "decoding.gamma=0 is invalid" in bad.stderr
    missing = run(tmp_path, "input=/nonexistent/file.es")
    assert missing.returncode != 0 and "cannot read input /nonexistent/file.es" in missing.stderr
    unknown = run(tmp_path, "decoding.nonsense=1")
    assert unknown.returncode != 0 and "Key 'nonsense' not in 'DecodingConfig'" in unknown.stderr
