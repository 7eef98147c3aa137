"""The extension's few-row product against oneDNN's packed one at a decoder call's shapes.

    .venv/bin/python scripts/bench_products.py                   # rows 1, 3, 5 and 8
    .venv/bin/python scripts/bench_products.py --rows 1 --hot    # one weight, kept in cache

The embedded target's products (model dim 512, feed-forward 2048, 8,000 tokens; q, k and v
stacked): each is timed over copies of its weight cycled so that every call streams its
weight from memory, as in a decoder call, whose weights do not fit the caches (`--hot`: the
same weight every call). Every shape and kernel in turn, repeated, so machine noise falls
alike (`bench_attention.interleaved`); prints min and median µs per call and oneDNN's median
over the few-row product's.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from types import ModuleType

import torch
from bench_attention import interleaved, table_row
from torch import Tensor

from specbeam.kernels import native, onednn
from specbeam.kernels.cpu import cpu_kind

SHAPES = {
    "q, k, v": (1536, 512),
    "attention output": (512, 512),
    "feed-forward in": (2048, 512),
    "feed-forward out": (512, 2048),
    "output projection": (8000, 512),
}
COLD_BYTES = 64 << 20  # the weight copies cycled: more than this CPU's caches


def kernels(
    out: int, inp: int, rows: int, hot: bool, ext: ModuleType
) -> tuple[dict[str, Callable[[], Tensor]], float]:
    """The two products of one shape over copies of a weight, and how far they differ."""
    copies = 1 if hot else max(2, COLD_BYTES // (out * inp * 4))
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(out, inp, generator=gen) / inp**0.5 for _ in range(copies)]
    packed = [onednn.packed(w) for w in weights]
    bias, x = torch.randn(out, generator=gen), torch.randn(1, rows, inp, generator=gen)
    turn = itertools.cycle(range(copies))
    few_turn = itertools.cycle(range(copies))

    def one_dnn() -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed[next(turn)], bias, "none", [], "")

    def few_rows() -> Tensor:
        return ext.few_rows_product(x, weights[next(few_turn)], bias)

    ref = torch.nn.functional.linear(x, weights[0], bias)
    diff = (ext.few_rows_product(x, weights[0], bias) - ref).abs().max().item()
    return {"oneDNN": one_dnn, "few rows": few_rows}, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 3, 5, 8])
    parser.add_argument("--hot", action="store_true", help="one weight, kept in cache")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="calls per timing")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ext = native.build()
    if ext is None:
        raise SystemExit("error: the native extension could not be built (scripts/setup.sh)")
    if any(not 1 <= r <= onednn.MAX_FEW_ROWS for r in args.rows):
        raise SystemExit(f"error: --rows are 1 to {onednn.MAX_FEW_ROWS}, not {args.rows}")
    runs: dict[str, dict[str, Callable[[], Tensor]]] = {}
    with torch.inference_mode():
        for rows in args.rows:
            for name, (out, inp) in SHAPES.items():
                label = f"{name} ({out} × {inp}), {rows} row{'s' * (rows > 1)}"
                runs[label], diff = kernels(out, inp, rows, args.hot, ext)
                print(f"{label}: max |few rows − torch| {diff:.1e}")
        times = interleaved(runs, args.repeats, args.calls)
    where = "one weight in cache" if args.hot else "weights streamed from memory"
    print(f"\n`lscpu`: {cpu_kind()}, {args.threads} threads, {where}; µs per call (min / median)\n")
    print("| product | oneDNN | few rows | oneDNN ÷ few rows (medians) |\n|---|---|---|---|")
    for label in runs:
        print(table_row(label, times[(label, "oneDNN")], times[(label, "few rows")], 1e6, 0))


if __name__ == "__main__":
    main()
