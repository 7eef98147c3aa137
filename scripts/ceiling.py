"""What a perfect draft would give exact spec_beam on the machine a bench ran on.

Reads `bench.json` of `scripts/bench.py` (the fitted target and draft call costs, the
measured costs per pass beside the calls, the lean plain and fairseq2 beam steps) and
prices trees whose every level holds the target's beam, so that a pass advances γ + 1
steps. No decoding runs: this is the cost model's ceiling, not a measurement.

    .venv/bin/python scripts/ceiling.py bench_out/bench.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TREES: tuple[tuple[int, int], ...] = ((2, 10), (3, 10), (4, 5), (6, 5), (8, 5))
"""(γ, width) priced with a perfect draft; width = beam size suffices when it is perfect."""


def table(record: dict, beam_size: int = 5) -> str:
    cost = record["cost_model"]
    verify, draft = cost["verify"], cost["draft"]
    spec = record["pass_breakdown"]["lean target"]
    beside = spec["acceptance"] + spec["cache commit"] + spec["other"]
    plain, fairseq2 = record["lean_plain_step_ms"], cost["step_ms"]

    def pass_ms(slots: float, calls: float, draft_slots: float) -> float:
        per_call = draft["a"] + draft["b"] * draft_slots
        return verify["a"] + verify["b"] * slots + calls * per_call + beside

    seen = record["pass_profile"]
    today = pass_ms(seen["slots"], seen["draft_calls"], seen["draft_slots"])
    rows = [("today, measured τ", seen["slots"], seen["draft_calls"], today, seen["tau"])]
    rows += [
        (f"γ {g}, width {w}, perfect draft", beam_size + g * w, g, pass_ms(beam_size + g * w, g, w), g + 1)
        for g, w in TREES
    ]  # fmt: skip
    lines = [
        f"lean plain step {plain:.2f} ms, fairseq2's beam step {fairseq2:.2f} ms, "
        f"{beside:.2f} ms per pass beside the calls",
        "",
        "| tree | verified tokens | draft calls | pass ms | τ | ms per step | vs lean plain | vs fairseq2 |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, slots, calls, ms, tau in rows:
        lines.append(
            f"| {name} | {slots:.1f} | {calls:.2f} | {ms:.1f} | {tau:.2f} | {ms / tau:.2f} "
            f"| {plain * tau / ms:.2f}× | {fairseq2 * tau / ms:.2f}× |"
        )
    lines += [
        "",
        f"At today's tree shape a pass costs {today:.1f} ms: τ {today / plain:.2f} breaks even "
        f"with lean plain search, τ {1.5 * today / fairseq2:.2f} gives 1.5× fairseq2's beam search.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json", type=Path, help="bench.json written by scripts/bench.py")
    args = parser.parse_args()
    print(table(json.loads(args.bench_json.read_text())))


if __name__ == "__main__":
    main()
