"""The lean layers' attention kernel against torch's SDPA at a beam's shapes, interleaved.

    .venv/bin/python scripts/bench_attention.py                  # sources 1 and 16
    .venv/bin/python scripts/bench_attention.py --sources 1 38 --prefix 5 28 60

Self-attention: each of k hypotheses' queries over the cache's interleaved prefixes (k × t
keys, a mask keeping the query's own t), as a plain step of the lean decoder calls it
(`specbeam.search.cache`); cross-attention: the k queries over a 32-token source. Heads and
head dim as the embedded target's. Every shape and kernel in turn, repeated, so machine noise
falls alike; prints min and median ms per call and SDPA's median over the kernel's.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from specbeam.kernels import attention, native
from specbeam.kernels.cpu import cpu_kind

HEADS, HEAD_DIM, SOURCE_LEN = 8, 64, 32


def problems(sources: int, beam: int, prefixes: list[int]) -> dict[str, tuple]:
    """q, k, v and bias of a plain step's self-attention at each prefix length, and of its
    cross-attention."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen)

    q = randn(sources, beam, HEADS, HEAD_DIM)
    found: dict[str, tuple] = {}
    for t in prefixes:
        keys = beam * t
        own = torch.arange(keys)[None, :] % beam == torch.arange(beam)[:, None]  # (k, k·t)
        bias = torch.zeros(beam, keys).masked_fill_(~own, -torch.inf)
        k, v = (randn(sources, keys, HEADS, HEAD_DIM) for _ in range(2))
        found[f"self, S={sources}, t={t}"] = (q, k, v, bias.expand(sources, 1, -1, -1))
    k, v = (randn(sources, SOURCE_LEN, HEADS, HEAD_DIM) for _ in range(2))
    found[f"cross, S={sources}"] = (q, k, v, None)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prefix", type=int, nargs="+", default=[5, 28, 60])
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="calls per timing")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ext = native.build()
    if ext is None:
        raise SystemExit("error: the native extension could not be built (scripts/setup.sh)")
    kernels = {"sdpa": attention.sdpa, "kernel": ext.ordered_attention}
    shapes: dict[str, tuple] = {}
    for s in args.sources:
        shapes.update(problems(s, args.beam, args.prefix))
    runs = {
        name: {kernel: functools.partial(run, *inputs) for kernel, run in kernels.items()}
        for name, inputs in shapes.items()
    }
    with torch.inference_mode():
        for name, inputs in shapes.items():
            diff = (attention.sdpa(*inputs) - ext.ordered_attention(*inputs)).abs().max().item()
            print(f"{name}: max |kernel − SDPA| {diff:.1e}")
        times = interleaved(runs, args.repeats, args.calls)
    print(f"\n`lscpu`: {cpu_kind()}, {args.threads} threads, beam {args.beam}, "
          f"{HEADS} heads of {HEAD_DIM}; ms per call (min / median)\n")  # fmt: skip
    print("| shape | SDPA | kernel | SDPA ÷ kernel (medians) |\n|---|---|---|---|")
    for name in shapes:
        print(table_row(name, times[(name, "sdpa")], times[(name, "kernel")], 1e3, 3))


def interleaved(
    runs: dict[str, dict[str, Callable[[], object]]], repeats: int, calls: int
) -> dict[tuple[str, str], list[float]]:
    """Seconds per call of each (shape, kernel) of `runs`, timed `repeats` times over
    `calls` calls, every shape and kernel in turn, so that machine noise falls alike."""
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for name, kernels in runs.items():
            for kernel, run in kernels.items():
                began = time.perf_counter()
                for _ in range(calls):
                    run()
                times.setdefault((name, kernel), []).append((time.perf_counter() - began) / calls)
    return times


def table_row(name: str, a: list[float], b: list[float], unit: float, digits: int) -> str:
    """A table row: a's and b's min / median in `unit`s of a second, and a's median over b's."""
    cells = [
        f"{min(t) * unit:.{digits}f} / {statistics.median(t) * unit:.{digits}f}" for t in (a, b)
    ]
    return (
        f"| {name} | {cells[0]} | {cells[1]} | {statistics.median(a) / statistics.median(b):.2f}× |"
    )


if __name__ == "__main__":
    main()
