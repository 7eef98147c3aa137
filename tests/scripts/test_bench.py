"""scripts/bench.py: the quick run prints every goal and the ceiling (`calibrate.ceiling_table`);
missing checkpoints are one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specbeam.integration.models import ModelPairConfig
from tests.scripts.conftest import REPO


def test_quick_run_prints_every_goal_and_the_ceiling(tmp_path) -> None:
    cmd = [sys.executable, "scripts/bench.py", "--quick", "--out", str(tmp_path)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "bench.md").read_text()
    for row in (
        "| spec_beam 5 as configured (planner: ",
        "| kernel gain: specbeam's plain beam 5 (lean) vs fairseq2's, batch 1 |",
        "| speculation gain: spec_beam 5 always speculating vs lean plain, batch 1 |",
        "| spec beam 5, batch 1: τ at γ=",
        "| efficiency: measured ÷ predicted speculation gain |",
        "| spec_beam 5 as configured, batches of 16: sentences/s vs beam |",
        "| spec greedy as configured vs greedy, batch 1: wall time |",
        "| relaxed beam 5, batch 1: wall time |",
        "| peak KV cache, self + cross attention (target + draft) ÷ beam's |",
        "| today, measured τ |",
        "| γ 2, width 5, perfect draft | 15.0 | 2.00 |",  # beam 5 + 2 levels of 5
    ):
        assert row in result.stdout and row in written
    assert "| ms per pass | fairseq2 target modules | lean target |" in written
    for exact in ("spec_beam 5 as configured", "specbeam's plain beam 5 (lean)",
                  "spec_beam 5 always speculating"):  # fmt: skip
        assert f"| {exact}, batch 1: identical output | – | 1.000 identical |" in result.stdout
    for name in ("bench.md", "bench.json", "bench.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_missing_checkpoints_are_named_in_one_line(script) -> None:
    pair = ModelPairConfig(name="future", target="tasks/none/target.pt", draft="random")
    with pytest.raises(
        SystemExit, match="checkpoint tasks/none/target.pt does not exist yet.*tiny_random"
    ):
        script("bench").check_checkpoints(pair)
