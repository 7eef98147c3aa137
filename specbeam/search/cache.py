"""Speculative KV cache: one buffer for all decoder layers of one model.

Layout, per source row s: the k columns' positions are interleaved position-major, so key
index `c * k + j` holds position c of column j, and position c of hypothesis i's prefix
lives in column `columns[s, i, c]`. Attention over the first `width * k` keys therefore
covers every hypothesis' prefix at once (a mask picks each query's own entries), and the
slots a verification or draft call appends ("speculative slots") follow at `width * k`.
Rollback is resetting `spec_len`. Commit moves no prefix: each surviving hypothesis takes
its origin's column map and writes its accepted path into its own column at the next
positions, which no live hypothesis uses yet (all of a source's hypotheses have the same
length). Copying prefixes, even only for branching children, was a measurable share of a
pass (docs/bench.md).

Like fairseq2's `FullAttentionState`, the buffer grows by `increment` positions when a
call needs more (None: it is allocated at `max_capacity` up front), and growing copies
only the live sources' live positions, so the peak follows the longest output rather
than the length limit. Buffers of finished caches are kept for the next ones
(`SpareBuffers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import final

import torch
from torch import Tensor
from typing_extensions import override

from specbeam.kernels import native
from specbeam.kernels.runtime import Runtime
from specbeam.kernels.states import SlottedSelfAttentionState


def surviving_rows(done: Tensor) -> Tensor:
    """`keep` for `select_sources` when the sources `done` (S,) finish: survivors within the
    first S' rows stay where they are, the ones beyond fill the finished rows' places. So
    only those move (the caches copy moved rows only). Keeping the order would move every
    row after the first finished one, at every step a source finishes."""
    alive = ~done
    keep = torch.arange(int(alive.sum()), device=done.device)
    num_alive = len(keep)
    keep[done[:num_alive]] = alive[num_alive:].nonzero().squeeze(1) + num_alive
    return keep


@final
class SpeculativeKVCache:
    def __init__(
        self,
        num_layers: int,
        num_sources: int,
        max_capacity: int,
        hyps_per_source: int,
        num_heads: int,
        head_dim: int,
        *,
        device: torch.device,
        dtype: torch.dtype,
        increment: int | None = None,
    ) -> None:
        if increment is not None and increment < 1:
            raise ValueError(f"`increment` must be ≥ 1 or None, but is {increment}.")
        self.k = hyps_per_source
        self.max_capacity = max_capacity
        self.increment = increment
        self._spares = Runtime.current().spares  # the creating generator's
        initial = max_capacity if increment is None else 0
        # (layers, K/V, S, C, k, H, D)
        shape = (num_layers, 2, num_sources, initial, hyps_per_source, num_heads, head_dim)
        self._allocate(shape, dtype, device)
        self.lens = torch.zeros(num_sources, dtype=torch.int64, device=device)  # cached positions
        # (S, k, C): the column holding each position of each hypothesis' prefix
        self.columns = self._own_columns(num_sources, initial, device)
        self.width = 0  # max(lens): where the speculative slots start, in positions
        self.spec_len = 0  # speculative slots written since the last commit
        self.peak_bytes = self.nbytes()

    def _own_columns(self, num_sources: int, positions: int, device: torch.device) -> Tensor:
        """(S, k, positions): hypothesis i in column i."""
        own = torch.arange(self.k, device=device)[None, :, None]
        return own.expand(num_sources, self.k, positions).contiguous()

    @property
    def capacity(self) -> int:
        """Positions per hypothesis allocated now."""
        return self.buf.size(3)

    def nbytes(self) -> int:
        """Bytes allocated (finished sources' rows included until the buffer next grows)."""
        return self._allocated * self.buf.element_size()

    def _allocate(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> None:
        numel = math.prod(shape)
        # Views do not record their base under inference mode: the storage is kept here.
        self._storage = self._spares.take(numel, dtype, device)
        self._allocated = numel  # a spare may be larger: the rest is not this cache's
        self.buf = self._storage[:numel].view(shape)

    def release(self) -> None:
        """Hands the buffer to the next cache; this one is unusable afterwards."""
        self._spares.give(self._storage)
        self._storage = self._storage[:0]
        self.buf = self._storage.view((0,) * self.buf.dim())

    def flat(self) -> Tensor:
        """(layers, 2, S, C * k, H, D) view: key index = position * k + hypothesis."""
        return self.buf.flatten(3, 4)

    def _parts(self) -> Tensor:
        """(layers · 2, S, C, k, H, D) view: one layer's keys or values per entry. Copies
        go part by part, so that each temporary stays in the CPU's cache."""
        layers, kv, num_sources, capacity, k, heads, dim = self.buf.shape
        return self.buf.view(layers * kv, num_sources, capacity, k, heads, dim)

    def layer_state(self, layer: int) -> SpeculativeSelfAttentionState:
        return SpeculativeSelfAttentionState(self, layer)

    def prefix_keys(self) -> int:
        return self.width * self.k

    def _positions(self, num_slots: int) -> int:
        """Positions per hypothesis that hold the prefixes, the speculative slots so far
        and `num_slots` more."""
        return -(-(self.prefix_keys() + self.spec_len + num_slots) // self.k)

    def reserve(self, num_slots: int) -> None:
        """Makes room for `num_slots` more speculative slots before a decoder call."""
        self._make_room(self._positions(num_slots))

    def _make_room(self, needed: int) -> None:
        """At least `needed` positions per hypothesis, growing by `increment`."""
        if needed <= self.capacity:
            return
        if needed > self.max_capacity or self.increment is None:
            raise RuntimeError("speculative KV cache overflow: capacity was sized too small")
        inc = self.increment
        self._reallocate(min(self.max_capacity, -(-needed // inc) * inc))

    def _reallocate(self, positions: int) -> None:
        """A new buffer of `positions` per hypothesis for the live sources, copying only
        the positions in use."""
        used = self.buf[:, :, :, : self._positions(0)]
        shape = list(self.buf.shape)
        shape[3] = positions
        old = self._storage
        self._allocate(shape, self.buf.dtype, self.buf.device)
        self.buf[:, :, :, : used.size(3)] = used
        grown = self._own_columns(
            self.columns.size(0), positions - self.columns.size(2), self.buf.device
        )
        self.columns = torch.cat([self.columns, grown], 2)
        self._spares.give(old)
        self.peak_bytes = max(self.peak_bytes, self.nbytes())

    def advance(self, num_slots: int) -> None:
        self.spec_len += num_slots
        if self.prefix_keys() + self.spec_len > self.capacity * self.k:
            raise RuntimeError("speculative KV cache overflow: reserve() was not called")

    def commit(self, origin: Tensor, keep: Tensor) -> None:
        """Keeps, for new hypothesis i of source s, the prefix of old hypothesis
        `origin[s, i]` followed by the speculative slots `keep[s, i]` (in slot order).

        origin: (S, k) long. keep: (S, k, spec_len) bool, every hypothesis of a source
        keeping the same number of slots (they advanced the same number of steps); or
        (S, k) long, one slot each (a plain step's roots), without a mask to search.
        Compiled where `native` is built and runs (csrc/cache.cpp, the same moves).
        """
        if len(self.lens) == 0:
            self.spec_len = 0
            return
        one = keep.dim() == 2
        # Slots were reserved for all k hypotheses together; each one's prefix and kept
        # slots must fit in its own positions.
        needed = self.lens.max() + 1 if one else (self.lens + keep[:, 0].sum(-1)).max()
        self._make_room(int(needed))
        ext = native.module_for(self.buf)
        if ext is not None:
            self.columns, self.lens = ext.commit(
                self.buf, self.columns, self.lens, self.width, origin, keep
            )
        elif one:
            self._commit_roots(origin, keep)
        else:
            self._commit_kept(origin, keep)
        self.width = int(self.lens.max())
        self.spec_len = 0

    def _commit_kept(self, origin: Tensor, keep: Tensor) -> None:
        flat, width, k = self.flat(), self.width, self.k
        s_idx, i_idx, slot = keep.nonzero(as_tuple=True)
        # (layers, 2, n, H, D): read the accepted slots before anything is overwritten.
        accepted = flat[:, :, s_idx, width * k + slot]
        self._inherit_columns(origin)
        # Rank of each kept slot within its hypothesis = its offset after the prefix.
        rank = keep.long().cumsum(-1)[s_idx, i_idx, slot] - 1
        self.buf[:, :, s_idx, self.lens[s_idx] + rank, i_idx] = accepted
        self.lens = self.lens + keep[:, 0].sum(-1)

    def _commit_roots(self, origin: Tensor, slot: Tensor) -> None:
        k = self.k
        rows = torch.arange(len(self.lens), device=origin.device)[:, None]
        # (layers, 2, S, k, H, D): read the roots before anything is overwritten.
        accepted = self.flat()[:, :, rows, self.width * k + slot]
        self._inherit_columns(origin)
        self.buf[:, :, rows, self.lens[:, None], torch.arange(k, device=origin.device)] = accepted
        self.lens = self.lens + 1

    def _inherit_columns(self, origin: Tensor) -> None:
        """Hypothesis i of source s takes the column map of hypothesis origin[s, i], and
        its own column from the prefix's end on."""
        num_sources, k, capacity = self.columns.shape
        inherited = self.columns.gather(1, origin[..., None].expand(-1, -1, capacity))
        beyond = torch.arange(capacity, device=origin.device) >= self.lens[:, None]  # (S, C)
        own = torch.arange(k, device=origin.device)[None, :, None]
        self.columns = torch.where(beyond[:, None, :], own, inherited)

    def prefix_columns(self, hyp: Tensor) -> Tensor:
        """(S, T, width): the column of each prefix position of hypothesis hyp[s, t] (S, T)."""
        columns = self.columns[:, :, : self.width]
        return columns.gather(1, hyp[..., None].expand(-1, -1, self.width))

    def select_sources(self, keep: Tensor) -> None:
        """Drops finished sources; `keep` (S',) indexes the surviving rows (row i takes
        row keep[i]; see `surviving_rows`).

        The moved rows' live positions are copied in place, one layer's keys or values at
        a time, and the buffer stays allocated until it next grows: in a large batch,
        sources finish one after another, and copying the whole cache into a new buffer
        each time is a large share of the decoding time (docs/bench.md)."""
        moved = (keep != torch.arange(len(keep), device=keep.device)).nonzero().squeeze(1)
        if len(moved):
            src = keep.index_select(0, moved)
            for part in self._parts()[:, :, : self._positions(0)]:
                part[moved] = part.index_select(0, src)
        self.buf = self.buf[:, :, : len(keep)]
        self.lens = self.lens.index_select(0, keep)
        self.columns = self.columns.index_select(0, keep)
        self.width = int(self.lens.max()) if len(self.lens) else 0

    def bytes_held(self) -> int:
        """Bytes of keys/values that are live (prefixes), not the reserved capacity."""
        layers, kv, _, _, k, heads, dim = self.buf.shape
        per_position = layers * kv * k * heads * dim * self.buf.element_size()
        return int(self.lens.sum()) * per_position


@final
class SpeculativeSelfAttentionState(SlottedSelfAttentionState):
    """A decoder self-attention layer's view of the shared speculative cache."""

    def __init__(self, cache: SpeculativeKVCache, layer: int) -> None:
        self._cache = cache
        self._layer = layer
        self._new = 0

    @override
    def append(self, k: Tensor, v: Tensor) -> None:
        # k, v: (S, T, H, D), the new slots of this call
        cache = self._cache
        start = cache.prefix_keys() + cache.spec_len
        self._new = k.size(1)
        flat = cache.flat()
        flat[self._layer, 0, :, start : start + self._new] = k
        flat[self._layer, 1, :, start : start + self._new] = v

    @override
    def buffers(self) -> tuple[Tensor, Tensor, int]:
        cache = self._cache
        flat = cache.flat()
        return flat[self._layer, 0], flat[self._layer, 1], cache.prefix_keys() + cache.spec_len

    @override
    def get(self) -> tuple[Tensor, Tensor]:
        cache = self._cache
        end = cache.prefix_keys() + cache.spec_len + self._new
        flat = cache.flat()
        return flat[self._layer, 0, :, :end], flat[self._layer, 1, :, :end]

    @override
    def reorder(self, new_order: Tensor) -> None:
        raise NotImplementedError("the speculative cache is reordered through commit()")

    @override
    def size_bytes(self) -> int:
        return self._cache.bytes_held() // self._cache.buf.size(0)

    @override
    def capacity_bytes(self) -> int:
        return self._cache.nbytes() // self._cache.buf.size(0)
