"""Packed against unpacked verification at batch > 1, side by side, with lean plain beam.

    .venv/bin/python scripts/bench_packing.py                       # batches 2, 4, 8, 16
    .venv/bin/python scripts/bench_packing.py --batch-sizes 4 --min-padding 0

At batch > 1 the sources of a batch draft to different depths and carry chains of
different lengths, so part of every slot table is padding; `lean_decoder.Packing` runs the
products over the valid slots only. Each batch is decoded by lean plain beam search, then
by spec_beam always speculating with packing (from `--min-padding`) and without, in turn,
`--rounds` times. Prints per batch size the padding share of the verified slots, the
summed seconds of each method, packed ÷ unpacked and speculating ÷ lean plain, and whether
the n-best lists agree; draws the speed ratios to `--png`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import matplotlib
import torch
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import Models, load_config  # noqa: E402

from specbeam.apps.compare import MethodRun, run_side_by_side  # noqa: E402
from specbeam.apps.decoding import load_decoding  # noqa: E402
from specbeam.search import lean_decoder  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NEVER = 2.0  # a MIN_PADDING no slot table reaches: every call computes every slot


class Padding:
    """Calls `inner` with `lean_decoder.MIN_PADDING` set to `min_padding`."""

    def __init__(self, inner: Seq2SeqGenerator, min_padding: float) -> None:
        self.inner, self.min_padding = inner, min_padding
        self.model, self.draft_model = inner.model, getattr(inner, "draft_model", None)

    def __call__(self, *args: object) -> SequenceGeneratorOutput:
        shipped, lean_decoder.MIN_PADDING = lean_decoder.MIN_PADDING, self.min_padding
        try:
            return self.inner(*args)
        finally:
            lean_decoder.MIN_PADDING = shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bible_es_en")
    parser.add_argument("--hardware", default="cpu")
    parser.add_argument("--every", type=int, default=28, help="every n-th test verse")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--min-padding", type=float, default=lean_decoder.MIN_PADDING)
    parser.add_argument("--rounds", type=int, default=2, help="runs over the verses, summed")
    parser.add_argument("--png", type=Path, default=Path("bench_out/packing.png"))
    args = parser.parse_args()

    cfg = load_config(args.model, args.hardware)
    models = Models.load(cfg)
    tokenizer = models.tokenizer
    sources = [p.source for p in cfg.task.split("test")[:: args.every]]
    spec = cfg.hardware.tune(load_decoding("spec_beam"))
    decodings = {
        "lean plain": cfg.hardware.tune(load_decoding("beam_lean")),
        "packed": dataclasses.replace(spec, plan=False),
        "unpacked": dataclasses.replace(spec, plan=False),
    }

    padding = {"lean plain": NEVER, "packed": args.min_padding, "unpacked": NEVER}
    print(
        f"{len(sources)} test verses (every {args.every}th), {args.rounds} rounds, "
        f"{torch.get_num_threads()} threads"
    )
    print("| batch | padding share | lean plain s | packed s | unpacked s "
          "| packed speedup | packed vs lean plain | identical |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"packed ÷ unpacked": [], "packed ÷ lean plain": []}
    for n in args.batch_sizes:
        runs = [
            MethodRun(name, Padding(models.generator(d), padding[name]))
            for name, d in decodings.items()
        ]
        started = time.perf_counter()
        for r in range(args.rounds):
            run_side_by_side(
                runs, tokenizer, sources, cfg.task.src_lang, cfg.task.tgt_lang,
                batch_size=n, desc=f"batch {n}, round {r + 1}",
            )  # fmt: skip
        plain, packed, unpacked = runs
        share = 1 - packed.stats.verified_slots / max(unpacked.stats.verified_slots, 1)
        same = packed.tokens == unpacked.tokens == plain.tokens
        print(
            f"| {n} | {share:.3f} | {plain.total_seconds:.2f} | {packed.total_seconds:.2f} "
            f"| {unpacked.total_seconds:.2f} "
            f"| {unpacked.total_seconds / packed.total_seconds:.3f}× "
            f"| {plain.total_seconds / packed.total_seconds:.3f}× | {same} |",
            flush=True,
        )
        print(f"(batch {n}: {time.perf_counter() - started:.0f} s)", file=sys.stderr)
        ratios["packed ÷ unpacked"].append(unpacked.total_seconds / packed.total_seconds)
        ratios["packed ÷ lean plain"].append(plain.total_seconds / packed.total_seconds)
    plot(args.batch_sizes, ratios, args.png)


def plot(batch_sizes: list[int], ratios: dict[str, list[float]], path: Path) -> None:
    """Speed of spec_beam (always speculating, packed) against each baseline, per batch."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in ratios.items():
        ax.plot(batch_sizes, values, marker="o", label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batch_sizes, [str(n) for n in batch_sizes])
    ax.set_xlabel("batch size (sentences)")
    ax.set_ylabel("speed ratio (baseline s ÷ packed s)")
    ax.set_title("packed verification, spec_beam always speculating")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
