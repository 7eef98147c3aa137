"""What a perfect draft would give exact spec_beam on the machine a bench ran on.

    .venv/bin/python scripts/ceiling.py bench_out/bench.json

Reads `bench.json` of `scripts/bench.py` (the fitted target and draft call costs, the
measured costs per pass beside the calls, the lean plain and fairseq2 beam steps) and
prices, as the planner does (`PlanCosts.pass_ms`), trees whose every level holds the
target's beam, so that a pass advances γ + 1 steps (`PassShape.perfect`). No decoding
runs: this is the cost model's ceiling, not a measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specbeam.search.draft import DraftShape
from specbeam.search.planner import LinearCost, PassShape, PlanCosts

TREES: tuple[tuple[int, int], ...] = ((2, 10), (3, 10), (4, 5), (6, 5), (8, 5))
"""(γ, width) priced with a perfect draft; width = beam size suffices when it is perfect."""


def bench_costs(record: dict, beam_size: int) -> PlanCosts:
    """The bench's fitted calls and lean plain step, and the work beside the calls that
    its always-speculating run measured at batch 1."""
    cost = record["cost_model"]
    target = LinearCost(**cost["verify"])
    spec = record["pass_breakdown"]["lean target"]
    beside = spec["acceptance"] + spec["cache commit"] + spec["other"]
    plain_beside = record["lean_plain_step_ms"] - target.ms(beam_size)
    return PlanCosts(target, LinearCost(**cost["draft"]), beside, plain_beside)


def table(record: dict, beam_size: int = 5) -> str:
    costs = bench_costs(record, beam_size)
    plain, fairseq2 = record["lean_plain_step_ms"], record["cost_model"]["step_ms"]
    seen = record["pass_profile"]
    today = PassShape(seen["tau"], seen["slots"], seen["draft_calls"], seen["draft_slots"])
    rows = [("today, measured τ", today)]
    rows += [
        (f"γ {g}, width {w}, perfect draft", PassShape.perfect(DraftShape(beam_size=beam_size, depth=g, width=w)))
        for g, w in TREES
    ]  # fmt: skip
    lines = [
        f"lean plain step {plain:.2f} ms, fairseq2's beam step {fairseq2:.2f} ms, "
        f"{costs.accept_ms:.2f} ms per pass beside the calls",
        "",
        "| tree | verified tokens | draft calls | pass ms | τ | ms per step | vs lean plain | vs fairseq2 |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, shape in rows:
        ms, tau = costs.pass_ms(True, beam_size, 1, shape), shape.tau
        lines.append(
            f"| {name} | {shape.slots:.1f} | {shape.draft_calls:.2f} | {ms:.1f} | {tau:.2f} "
            f"| {ms / tau:.2f} | {costs.speedup(beam_size, shape):.2f}× | {fairseq2 * tau / ms:.2f}× |"
        )
    today_ms = costs.pass_ms(True, beam_size, 1, today)
    lines += [
        "",
        f"At today's tree shape a pass costs {today_ms:.1f} ms: τ {today_ms / plain:.2f} breaks "
        f"even with lean plain search, τ {1.5 * today_ms / fairseq2:.2f} gives 1.5× fairseq2's "
        "beam search.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path, help="bench.json written by scripts/bench.py")
    args = parser.parse_args()
    print(table(json.loads(args.bench_json.read_text())))


if __name__ == "__main__":
    main()
