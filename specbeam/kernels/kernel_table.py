"""Which kernel runs an fp32 product of a given shape on this machine, chosen by measuring.

The fastest kernel for x (rows, in) @ W.T (out, in) depends on the CPU, the thread count,
the row count and the weight's shape: MKL's small-GEMM kernels beat oneDNN's packed one
below a few rows on some Intel CPUs and lose to it on AMD ones, the extension's few-row
product wins where oneDNN's per-call cost dominates, and MKL's packed GEMM wins where a
row count recurs. A rule by vendor is right only on the CPUs it was measured on. So the
first time a shape is met, every kernel that can run it is timed on copies of its weight
that stream from memory as in a decoder call, and the fastest is kept, for this process
and on disk (`~/.cache/specbeam/kernels/`, `$SPECBEAM_KERNEL_DIR`), keyed by the CPU, the
thread count and torch's version. A table measured elsewhere is not used: its shapes are
measured again, with a one-line notice. Each choice holds for the thread count it was
measured on.

Row counts above `ROW_GRID`'s last take its choice: from there every kernel is bound by
its arithmetic, and oneDNN's and MKL's blocked GEMMs are alike.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import final

import torch
from torch import Tensor

from specbeam.kernels.cpu import cpu_kind

log = logging.getLogger(__name__)

ROW_GRID = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
"""Row counts measured; a count between two takes the lower one's choice."""
COLD_BYTES = 64 << 20
"""Weight copies cycled while timing: more than the CPU's caches, as a decoder's weights."""
ROUNDS = 5
"""Interleaved rounds over the candidates and copies: each one's fastest call decides."""

FP32_NAMES = ("mkl", "mkl_packed", "onednn", "few_rows")
"""The kernels a table may hold (`specbeam.kernels.onednn.FP32_KINDS` runs them)."""
Candidate = Callable[[Tensor, int], Tensor]
"""A kernel on one of the weight's copies: (x, copy index) -> x @ copy.T + bias."""


def grid_rows(rows: int) -> int:
    """The measured row count whose choice `rows` takes."""
    return ROW_GRID[max(0, bisect.bisect_right(ROW_GRID, rows) - 1)]


def machine() -> dict[str, object]:
    """What a table holds for: the CPU and torch (its kernels' versions)."""
    return {"cpu": cpu_kind(), "torch": torch.__version__}


def table_path() -> Path:
    root = os.environ.get("SPECBEAM_KERNEL_DIR") or Path.home() / ".cache" / "specbeam" / "kernels"
    return Path(root) / "products.json"


def time_candidates(
    candidates: Mapping[str, Candidate], x: Tensor, copies: int, rounds: int = ROUNDS
) -> dict[str, float]:
    """Each candidate's fastest call, in seconds, over every copy in turn and `rounds`
    rounds, the candidates interleaved: a call the machine's other work slowed down (a
    preemption costs milliseconds, a product microseconds) does not decide."""
    with torch.inference_mode():
        for run in candidates.values():  # warm-up: first calls allocate and pack
            run(x, 0)
        fastest = dict.fromkeys(candidates, float("inf"))
        for _ in range(rounds):
            for name, run in candidates.items():
                for i in range(copies):
                    began = time.perf_counter()
                    run(x, i)
                    fastest[name] = min(fastest[name], time.perf_counter() - began)
    return fastest


@final
class KernelTable:
    """The kernel chosen per (threads, row count, out, in, candidates), measured on first
    use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.machine = machine()
        self.choices: dict[str, str] = {}
        self.seconds: dict[str, dict[str, float]] = {}  # µs per call, per candidate
        self._fast: dict[tuple, str] = {}
        self._read()

    def _read(self) -> None:
        try:
            stored = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if stored.get("machine") != self.machine:
            log.warning(
                "the kernel table %s was measured on %s; measuring products again on %s",
                self.path, _describe(stored.get("machine")), _describe(self.machine),
            )  # fmt: skip
            return
        self.choices = dict(stored.get("choices", {}))
        self.seconds = dict(stored.get("seconds", {}))

    def _write(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.partial")
            record = {"machine": self.machine, "choices": self.choices, "seconds": self.seconds}
            partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            partial.replace(self.path)
        except OSError as error:  # a read-only home: the choice holds for this process
            log.warning("the kernel table could not be written to %s: %s", self.path, error)

    def choose(
        self,
        rows: int,
        weight: Tensor,
        names: tuple[str, ...],
        candidates: Callable[[int], Mapping[str, Candidate]],
    ) -> str:
        """The fastest of the kernels `names` for `rows` rows of `weight`; measured the
        first time on the kernels `candidates(copies)` builds over copies of the weight."""
        fast = (rows, weight.size(0), weight.size(1), names, torch.get_num_threads())
        choice = self._fast.get(fast)
        if choice is not None:
            return choice
        threads, grid = torch.get_num_threads(), grid_rows(rows)
        key = (
            f"{threads} threads, {grid} rows, {weight.size(0)}x{weight.size(1)}: {','.join(names)}"
        )
        choice = self.choices.get(key)
        if choice is None:
            copies = max(1, min(8, -(-COLD_BYTES // (weight.numel() * weight.element_size()))))
            # Its own generator: a measurement must not move the global one (a seeded
            # sampling run measures on its first call only).
            x = torch.randn(grid, weight.size(1), dtype=weight.dtype, generator=torch.Generator())
            seconds = time_candidates(candidates(copies), x, copies)
            self.seconds[key] = {name: round(s * 1e6, 2) for name, s in seconds.items()}
            choice = self.choices[key] = min(seconds, key=seconds.__getitem__)
            self._write()
        self._fast[fast] = choice
        return choice


def markdown(table: KernelTable) -> str:
    """The table's choices and timings, one row per shape, for docs/bench.md."""
    lines = [
        f"Kernel chosen per fp32 product on {_describe(table.machine)} (µs per call, "
        f"the fastest of each kernel's calls; `{table.path}`)",
        "", "| threads, rows, weight (out×in) | chosen | " + " | ".join(FP32_NAMES) + " |",
        "|---|---|" + "---|" * len(FP32_NAMES),
    ]  # fmt: skip
    for key, choice in sorted(table.choices.items(), key=lambda kv: _order(kv[0])):
        seconds = table.seconds.get(key, {})
        cells = [f"{seconds[n]:.1f}" if n in seconds else "–" for n in FP32_NAMES]
        lines.append(f"| {key.split(':')[0]} | {choice} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _order(key: str) -> tuple[int, ...]:
    head = key.split(":")[0].replace(",", "").replace("x", " ").split()
    return tuple(int(t) for t in head if t.isdigit())


def _describe(found: object) -> str:
    if not isinstance(found, dict):
        return "an unknown machine"
    return f"{found.get('cpu')}, torch {found.get('torch')}"


@functools.cache
def _table(path: Path) -> KernelTable:
    return KernelTable(path)


def current() -> KernelTable:
    """This process's table (its file read once)."""
    return _table(table_path())
