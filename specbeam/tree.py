"""Draft trees: every source's drafted nodes as a (depth, width) grid."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specbeam.tree_attention import SlotTable


@dataclass
class DraftTree:
    """Node (d, b) is the b-th drafted token at depth d + 1 below the live hypotheses.

    Its parent is live hypothesis `parents[s, 0, b]` for d = 0, else node
    (d - 1, parents[s, d, b]). A node id is `d * width + b`.
    """

    tokens: Tensor  # (S, D, w) long
    parents: Tensor  # (S, D, w) long
    valid: Tensor  # (S, D, w) bool

    @property
    def depth(self) -> int:
        return self.tokens.size(1)

    @property
    def width(self) -> int:
        return self.tokens.size(2)

    def add_to(self, table: SlotTable, root_slots: Tensor, depth: int | None = None) -> Tensor:
        """Adds levels [0, depth) to a slot table below the given root slots (S, n);
        returns the node slots (S, depth, w)."""
        parent_slots, levels = root_slots, []
        for d in range(self.depth if depth is None else depth):
            parents = parent_slots.gather(1, self.parents[:, d])
            parent_slots = table.add_nodes(self.tokens[:, d], parents, self.valid[:, d])
            levels.append(parent_slots)
        if not levels:
            return root_slots.new_zeros((root_slots.size(0), 0, self.width))
        return torch.stack(levels, dim=1)

    def num_nodes(self) -> Tensor:
        return self.valid.flatten(1).sum(1)
