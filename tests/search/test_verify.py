"""Verification's bookkeeping: slots of nodes and the accepted paths a draft head re-reads."""

from __future__ import annotations

import pytest
import torch

from specbeam.search.slots import SlotTable
from specbeam.search.tree import DraftTree
from specbeam.search.verify import Verification


def verification() -> Verification:
    """Two sources, two hypotheses with 2-link chains (source 1's chains hold one valid link),
    then two tree levels of width 2."""
    table = SlotTable(2, 8, torch.device("cpu"))
    chains = torch.tensor([[[5, 6], [7, 8]], [[0, 9], [0, 10]]])
    roots = table.add_chains(chains, torch.tensor([2, 1]), torch.tensor([3, 4]))
    tree = DraftTree(
        tokens=torch.tensor([[[11, 12], [13, 14]], [[21, 22], [23, 24]]]),
        parents=torch.tensor([[[0, 1], [1, 0]], [[1, 1], [0, 1]]]),
        valid=torch.ones((2, 2, 2), dtype=torch.bool),
        scores=torch.zeros((2, 2, 2)),
    )
    node_slots = tree.add_to(table, roots)
    chain_slots = roots[..., None] - torch.arange(1, -1, -1)
    hidden = torch.arange(2 * 8, dtype=torch.float32).view(2, 8, 1)
    return Verification(table, chain_slots, node_slots, hidden, torch.zeros((2, 8, 3)), 16)


def test_slots_of_roots_and_nodes() -> None:
    v = verification()
    origin, node = torch.tensor([[1, 0], [0, 1]]), torch.tensor([[-1, 2], [3, -1]])
    # -1: the origin's root (chain end); node d·w + b: its slot in the tree block.
    assert v.slot_of(origin, node).tolist() == [[3, 6], [7, 3]]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_accepted_paths_run_from_the_chain_through_the_tree_right_aligned(
    compiled, use_runtime
) -> None:
    """The same paths compiled (csrc/slots.cpp) and from torch ops."""
    use_runtime(native=compiled)
    v = verification()
    # Source 0: node 2 (depth 1, b 0) has parent node 1 (depth 0, b 1), whose parent is
    # hypothesis 1 (chain slots 2, 3). Source 1: node 3 (depth 1, b 1) -> node 1 -> hyp 1,
    # whose chain has one valid link (slot 3; slot 2 is padding).
    origin, node = torch.tensor([[1, 1], [1, 1]]), torch.tensor([[2, 1], [3, 1]])
    paths = v.path_slots(origin, node)
    assert paths[0].tolist() == [[2, 3, 5, 6], [-1, 2, 3, 5]]
    assert paths[1].tolist() == [[-1, 3, 5, 7], [-1, -1, 3, 5]]
    tokens = v.table.tokens[torch.arange(2)[:, None, None], paths.clamp(min=0)]
    assert tokens[0, 0].tolist() == [7, 8, 12, 13]
