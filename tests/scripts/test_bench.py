"""scripts/bench.py: the quick run prints every goal and the ceiling; missing checkpoints
are one line; the ceiling prices a perfect draft's trees as the planner does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specbeam.integration.models import ModelPairConfig
from specbeam.search.planner import LinearCost, PassShape, PlanCosts
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
        "| γ 2, width 10, perfect draft | 25.0 | 2.00 |",  # beam 5 + 2 levels of 10
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


def test_ceiling_prices_a_perfect_draft_as_the_planner_does(script) -> None:
    """Target 10 + 0.2·T ms, draft calls 2 ms, 4 ms per pass beside the calls, a plain
    step 12 ms: a perfect γ 2 / width 10 tree verifies 25 tokens with 2 draft calls
    (23 ms) for τ 3."""
    costs = PlanCosts(LinearCost(10.0, 0.2), LinearCost(2.0, 0.0), 4.0, plain_step_ms=1.0)
    seen = PassShape(tau=2.0, slots=25.0, draft_calls=2.0, draft_slots=10.0)
    out = script("bench").ceiling_table(costs, seen, fairseq2_step_ms=13.2, k=5)
    assert "lean plain step 12.00 ms, fairseq2's beam step 13.20 ms, 4.00 ms" in out
    assert "| today, measured τ | 25.0 | 2.00 | 23.0 | 2.00 | 11.50 | 1.04× | 1.15× |" in out
    assert (
        "| γ 2, width 10, perfect draft | 25.0 | 2.00 | 23.0 | 3.00 | 7.67 | 1.57× | 1.72× |" in out
    )
    assert (
        "| γ 4, width 5, perfect draft | 25.0 | 4.00 | 27.0 | 5.00 | 5.40 | 2.22× | 2.44× |" in out
    )
    assert "τ 1.92 breaks even with lean plain search, τ 2.61 gives 1.5×" in out
