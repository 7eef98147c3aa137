"""The slot table: chains and nodes, and who sees whom."""

from __future__ import annotations

import pytest
import torch

from specbeam.search.slots import SlotTable


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("lengths", [[1, 1], [1, 0]])
def test_roots_alone_make_the_table_a_one_link_chain_would(compiled, lengths, use_runtime) -> None:
    """The shortcut for chains of one link (every pass after the first; compiled where the
    extension runs, csrc/inputs.cpp) builds what the general chains do: the same slots as
    a chain of two links whose first is padding."""
    use_runtime(native=compiled)
    tokens = torch.tensor([[[4], [5], [6]], [[7], [8], [9]]])
    lengths, starts = torch.tensor(lengths), torch.tensor([3, 9])
    short = SlotTable(2, 3, torch.device("cpu"))
    roots = short.add_chains(tokens, lengths, starts)
    padded = SlotTable(2, 6, torch.device("cpu"))
    padded_roots = padded.add_chains(torch.cat([torch.zeros_like(tokens), tokens], 2), lengths, starts)  # fmt: skip
    assert roots.tolist() == [[0, 1, 2]] * 2 and padded_roots.tolist() == [[1, 3, 5]] * 2
    at = padded_roots[0]
    for name in ["tokens", "positions", "hyp", "valid"]:
        assert torch.equal(getattr(short, name), getattr(padded, name)[:, at]), name
    assert torch.equal(short.visible, padded.visible[:, at][:, :, at])
