"""The attention states the native layers write and read (`specbeam.kernels.native_layers`):
a self-attention state that hands out its layer's buffers, and static cross-attention keys.
The search's speculative cache (`specbeam.search.cache`) implements the first."""

from __future__ import annotations

from abc import abstractmethod
from typing import final

from fairseq2.models.transformer import AttentionState
from torch import Tensor
from typing_extensions import override


class SlottedSelfAttentionState(AttentionState):
    """A self-attention layer's state whose keys and values lie in one buffer that a call
    writes its new slots into, so the native layers can write and attend in place."""

    @abstractmethod
    def buffers(self) -> tuple[Tensor, Tensor, int]:
        """This layer's keys and values (S, keys, H, D) and where a call's new slots go:
        what `append` and `get` use."""


@final
class CrossAttentionState(AttentionState):
    """Encoder-decoder keys/values, one row per source.

    fairseq2's `StaticAttentionState.reorder` skips permutations that keep the batch
    size, which would leave cross-attention keys of the wrong source; this one does not.
    """

    def __init__(self, k: Tensor, v: Tensor) -> None:
        self._k, self._v = k, v

    @override
    def append(self, k: Tensor, v: Tensor) -> None:
        raise RuntimeError("cross-attention keys are static")

    @override
    def get(self) -> tuple[Tensor, Tensor]:
        return self._k, self._v

    @override
    def reorder(self, new_order: Tensor) -> None:
        self._k = self._k.index_select(0, new_order)
        self._v = self._v.index_select(0, new_order)

    @override
    def size_bytes(self) -> int:
        return self.capacity_bytes()

    @override
    def capacity_bytes(self) -> int:
        return 2 * self._k.numel() * self._k.element_size()
