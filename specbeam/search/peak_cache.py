"""Peak KV-cache bytes of any fairseq2 generator, measured the same way for all.

fairseq2's `counters.cache_capacity` is read after the last step, when finished sources'
rows are gone, so at batch > 1 it understates the peak. The probe instead reads every
incremental state bag (self- and cross-attention keys and values) after each decoder
call of every model a generator runs, and keeps each bag's largest reservation. Calls
that bypass the decoder module (the lean draft path) report themselves through `observe`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any, final

from fairseq2.nn import IncrementalStateBag
from torch.nn import Module
from torch.utils.hooks import RemovableHandle


@final
class PeakCacheProbe:
    def __init__(self, models: Iterable[Module]) -> None:
        self._peaks: dict[int, int] = {}  # id(state bag) -> its largest capacity in bytes
        decoders = {id(m.decoder): m.decoder for m in models}
        self._decoders = set(decoders)
        self._handles: list[RemovableHandle] = [
            d.register_forward_hook(self._record, with_kwargs=True) for d in decoders.values()
        ]
        _probes.add(self)

    def _record(self, module: Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        bag = kwargs.get("state_bag")
        if isinstance(bag, IncrementalStateBag):
            self.observe(module, bag)

    def observe(self, decoder: Module, bag: IncrementalStateBag) -> None:
        if id(decoder) in self._decoders:
            key = id(bag)
            self._peaks[key] = max(self._peaks.get(key, 0), bag.capacity_bytes())

    def take(self) -> int:
        """Bytes reserved at the peak by the calls since the last `take`: the sum of each
        state bag's peak (the target's and the draft's may peak at different steps, so
        this is an upper bound on their joint peak)."""
        total = sum(self._peaks.values())
        self._peaks.clear()
        return total

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        _probes.discard(self)


_probes: weakref.WeakSet[PeakCacheProbe] = weakref.WeakSet()


def observe(decoder: Module, bag: IncrementalStateBag) -> None:
    """Reports a call of `decoder` made without calling the module, to every open probe."""
    if not _probes:  # the usual case: a decoding outside evaluate's memory probe
        return
    for probe in _probes:
        probe.observe(decoder, bag)
