"""The attention states the native layers use: static cross-attention keys, and the slot
buffers a self-attention state hands out (the speculative cache's, tested with it)."""

from __future__ import annotations

import pytest
import torch

from specbeam.kernels.states import CrossAttentionState, SlottedSelfAttentionState
from specbeam.search.cache import SpeculativeKVCache


def test_cross_attention_reorders_same_size_permutation() -> None:
    """fairseq2's StaticAttentionState skips this case; ours must not."""
    k = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 1, 4).clone()
    state = CrossAttentionState(k, k + 10)
    state.reorder(torch.tensor([2, 0, 1]))
    keys, values = state.get()
    assert keys[:, 0, 0, 0].tolist() == [2.0, 0.0, 1.0]
    assert values[:, 0, 0, 0].tolist() == [12.0, 10.0, 11.0]


def test_cross_attention_keys_are_static() -> None:
    k = torch.zeros(1, 2, 1, 4)
    with pytest.raises(RuntimeError, match="static"):
        CrossAttentionState(k, k).append(k, k)


def test_the_speculative_cache_hands_out_slot_buffers() -> None:
    """The native layers write a layer's new slots where `buffers` says, and read them
    back through `get`: both must agree."""
    cache = SpeculativeKVCache(2, 1, 4, 2, 1, 3, device=torch.device("cpu"), dtype=torch.float32)
    state = cache.layer_state(1)
    assert isinstance(state, SlottedSelfAttentionState)
    cache.reserve(2)
    new = torch.arange(6.0).view(1, 2, 1, 3)
    state.append(new, new + 100)
    keys, values, start = state.buffers()
    assert start == 0
    assert torch.equal(keys[:, start : start + 2], new)
    assert torch.equal(state.get()[1], new + 100)
