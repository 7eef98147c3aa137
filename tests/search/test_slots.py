"""The slot table: chains and nodes, and who sees whom."""

from __future__ import annotations

import pytest
import torch

from specbeam.search.slots import SlotTable
from specbeam.search.tree import DraftTree


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
@pytest.mark.parametrize("lengths", [[1, 1], [1, 0]])
def test_roots_alone_make_the_table_a_one_link_chain_would(compiled, lengths, use_runtime) -> None:
    """The shortcut for chains of one link (every pass after the first; compiled where the
    extension runs, csrc/slots.cpp) builds what the general chains do: the same slots as
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


@pytest.mark.parametrize("seed", range(6))
def test_compiled_writes_are_the_torch_writes(seed: int, use_runtime) -> None:
    """Chains of several links (some padding), a draft tree (columns no source uses, a
    level nobody drafts), then a block of nodes: the compiled table (csrc/slots.cpp) is
    the torch one, slot for slot."""
    gen = torch.Generator().manual_seed(seed)
    num_sources, n, c, depth, w = 3, 2, 3, 3, 4
    chains = torch.randint(4, 40, (num_sources, n, c), generator=gen)
    lengths = torch.randint(1, c + 1, (num_sources,), generator=gen)
    starts = torch.randint(0, 9, (num_sources,), generator=gen)
    valid = torch.rand(num_sources, depth, w, generator=gen) < 0.6
    valid[:, :, -1] = False  # a column no source uses
    valid[:, 2] = seed % 2 == 0  # every third level empty for odd seeds
    tree = DraftTree(
        torch.randint(4, 40, (num_sources, depth, w), generator=gen),
        torch.randint(0, w, (num_sources, depth, w), generator=gen),
        valid,
        torch.zeros(num_sources, depth, w),
    )
    block = torch.randint(4, 40, (num_sources, 2), generator=gen)
    results = []
    for compiled in (True, False):
        use_runtime(native=compiled)
        table = SlotTable(num_sources, n * c + depth * w + 2, torch.device("cpu"))
        roots = table.add_chains(chains, lengths, starts)
        node_slots = tree.add_to(table, roots)
        nodes = table.add_nodes(
            block, node_slots[:, 0, :2], torch.tensor([True, False]).expand(3, 2)
        )
        results.append([roots, node_slots, nodes, torch.tensor(table.size), *table.tensors()])
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
