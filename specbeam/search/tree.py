"""Draft trees: every source's drafted nodes as a (depth, width) grid."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specbeam.kernels import native
from specbeam.search.slots import SlotTable


@dataclass
class DraftTree:
    """Node (d, b) is the b-th drafted token at depth d + 1 below the live hypotheses.

    Its parent is live hypothesis `parents[s, 0, b]` for d = 0, else node
    (d - 1, parents[s, d, b]). A node id is `d * width + b`.
    """

    tokens: Tensor  # (S, D, w) long
    parents: Tensor  # (S, D, w) long
    valid: Tensor  # (S, D, w) bool
    scores: Tensor  # (S, D, w) cumulative scores the draft ranked them by

    @staticmethod
    def empty(num_sources: int, device: torch.device) -> DraftTree:
        """No drafted nodes: a pass over it verifies the roots alone (plain search)."""
        tokens = torch.zeros((num_sources, 0, 1), dtype=torch.int64, device=device)
        return DraftTree(tokens, tokens, tokens.bool(), tokens.float())

    @property
    def depth(self) -> int:
        return self.tokens.size(1)

    @property
    def width(self) -> int:
        return self.tokens.size(2)

    def limit(self, max_nodes: int) -> DraftTree:
        """Keeps each source's `max_nodes` most likely nodes (by draft score). A child
        never outscores its parent, so the kept set is a tree; ties are closed explicitly."""
        flat = self.scores.masked_fill(~self.valid, -torch.inf).flatten(1)
        if max_nodes >= flat.size(1):
            return self
        keep = torch.zeros_like(flat, dtype=torch.bool)
        keep.scatter_(1, flat.topk(max_nodes, dim=1).indices, True)
        valid = (keep & self.valid.flatten(1)).view_as(self.valid)
        for d in range(1, self.depth):
            valid[:, d] &= valid[:, d - 1].gather(1, self.parents[:, d])
        return DraftTree(self.tokens, self.parents, valid, self.scores)

    def add_to(self, table: SlotTable, root_slots: Tensor) -> Tensor:
        """Adds the nodes to a slot table below the given root slots (S, n) and returns
        their slots (S, D, w). Columns no source uses are left out of the table: those
        nodes get slot 0 and are never looked up (they are invalid). Compiled where
        `native` is built and runs (csrc/slots.cpp, the same writes)."""
        ext = native.module_for(root_slots)
        if ext is not None:
            args = (self.tokens, self.parents, self.valid)
            node_slots, table.size = ext.add_tree(table.tensors(), table.size, root_slots, *args)
            return node_slots
        node_slots = root_slots.new_zeros(self.tokens.shape)
        parent_slots = root_slots
        for d in range(self.depth):
            used = int(self.valid[:, d].any(0).nonzero().max()) + 1 if self.valid[:, d].any() else 0
            if used == 0:
                break
            parents = parent_slots.gather(
                1, self.parents[:, d, :used].clamp(max=parent_slots.size(1) - 1)
            )
            node_slots[:, d, :used] = table.add_nodes(
                self.tokens[:, d, :used], parents, self.valid[:, d, :used]
            )
            parent_slots = node_slots[:, d]
        return node_slots

    def num_nodes(self) -> Tensor:
        return self.valid.flatten(1).sum(1)
