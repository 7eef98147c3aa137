"""What a generator brings to its own calls: which CPU kernels run its decoders, and the
released cache buffers it keeps for the next call.

These are choices of one generator, not of the process: two generators in one process
may differ. A generator makes its `Runtime` current for the length of a call
(`Runtime.current`), and the kernels and caches below it read the current one there, as
torch's autocast and inference mode are read. Outside any call the defaults apply.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar, final

import torch
from torch import Tensor

from specbeam.kernels.cpu import cpu_info

MB = 2**20  # the settings' megabytes (spare_cache_mb, memory_budget_mb)
KERNEL_CHOICES = ("measured", "vendor")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(kw_only=True)
class RuntimeConfig:
    onednn: bool = True
    """Linear layers of the lean decoders through oneDNN with packed weights
    (`specbeam.kernels.onednn`); false: PyTorch's default."""
    kernels: str = "measured"
    """How an fp32 product's kernel is chosen: `measured`, the fastest on this machine for
    its shape (`specbeam.kernels.kernel_table`); `vendor`, by the CPU's vendor
    (`default_min_rows`) and width, as measured once on a few CPUs."""
    onednn_min_rows: int | None = None
    """fp32 products of fewer rows run on PyTorch's default (MKL) instead; None: as
    `kernels` chooses."""
    native: bool = True
    """The lean decoders' layer loop and exact acceptance compiled
    (`specbeam.kernels.native`); false: the same ops in Python."""
    spare_cache_mb: float = 256
    """MiB of released KV-cache buffers kept for the next call (`SpareBuffers`)."""

    def problems(self) -> list[tuple[str, object, str]]:
        checks = [
            ("kernels", self.kernels, self.kernels in KERNEL_CHOICES, " or ".join(KERNEL_CHOICES)),
            ("onednn_min_rows", self.onednn_min_rows, self.onednn_min_rows is None or self.onednn_min_rows >= 1, "≥ 1 or None"),
            ("spare_cache_mb", self.spare_cache_mb, self.spare_cache_mb >= 0, "≥ 0"),
        ]  # fmt: skip
        return [(name, value, allowed) for name, value, ok, allowed in checks if not ok]


@final
class SpareBuffers:
    """Buffers of released caches, kept for the next ones. A fresh buffer costs a page
    fault per 4 KB page on first touch; zeroing memory already mapped costs a fraction of
    that. Zeros, not stale values: attention reads masked keys, and a masked NaN would
    still poison the weighted sum."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._free: list[Tensor] = []  # flat, zero-filled when first allocated

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """Flat storage of at least `numel` elements, the first `numel` zero: the
        smallest spare that holds them, else a new one."""
        # An inference-mode tensor cannot be written outside inference mode.
        mode = torch.is_inference_mode_enabled()
        fits = [
            i
            for i, b in enumerate(self._free)
            if (b.dtype, b.device, b.is_inference()) == (dtype, device, mode) and b.numel() >= numel
        ]
        if not fits:
            return torch.zeros(numel, dtype=dtype, device=device)
        storage = self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
        storage[:numel].zero_()
        return storage

    def give(self, storage: Tensor) -> None:
        """Keeps `storage` (from `take`), dropping the smallest spares beyond the limit."""
        self._free.append(storage)
        self._free.sort(key=Tensor.numel, reverse=True)
        while sum(b.numel() * b.element_size() for b in self._free) > self.limit_bytes:
            self._free.pop()


@functools.cache
def default_min_rows() -> int:
    """Rows from which fp32 products run on oneDNN by vendor (`kernels: vendor`, where
    `onednn_min_rows` is not set): 8 on Intel CPUs (MKL's own small-GEMM kernels won below
    on the one measured), 1 elsewhere."""
    return 8 if cpu_info("vendor_id") == "GenuineIntel" else 1


@final
class Runtime:
    """One generator's kernels and spare buffers."""

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        self.config = config = config or RuntimeConfig()
        self.onednn = config.onednn
        self.kernels = config.kernels
        self.onednn_min_rows = config.onednn_min_rows or (
            default_min_rows() if config.kernels == "vendor" else 1
        )
        self.native = config.native
        self.spares = SpareBuffers(limit_bytes=int(config.spare_cache_mb * MB))

    @staticmethod
    def current() -> Runtime:
        """The runtime of the generator whose call is running, else the defaults."""
        return _current.get()

    @contextmanager
    def active(self) -> Iterator[None]:
        """Makes this runtime current for the block."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)


def in_own_runtime(call: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """Decorates a generator's `__call__`: the generator's own runtime (`_runtime`) is
    current while it runs."""

    @functools.wraps(call)
    def wrapped(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._runtime.active():
            return call(self, *args, **kwargs)

    return wrapped


# One shared default on purpose: decoder calls outside any generator (timings, training)
# share its spare buffers.
_current: ContextVar[Runtime] = ContextVar("specbeam_runtime", default=Runtime())  # noqa: B039
