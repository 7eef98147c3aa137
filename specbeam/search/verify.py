"""Verification: one target decoder call over every source's roots and draft tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import torch
from torch import Tensor

from specbeam.kernels import native
from specbeam.search.slots import SlotTable
from specbeam.search.tree import DraftTree
from specbeam.search.tree_attention import TreeDecoder


@dataclass
class Verification:
    table: SlotTable
    chain_slots: Tensor  # (S, n, c) slots of each hypothesis' pending chain, root last
    node_slots: Tensor  # (S, D, w)
    features: Tensor  # (S, T, F) what a draft head reads (TreeDecoder.features)
    logits: Tensor  # (S, T, V), T = n * c + D * w
    computed_slots: int  # of the S·T: the lean target computes the valid ones only at batch > 1

    @property
    def root_slots(self) -> Tensor:
        return self.chain_slots[..., -1]

    def logits_at(self, slots: Tensor) -> Tensor:
        """Logits (S, m, V) of slots (S, m)."""
        return self.logits[torch.arange(slots.size(0), device=slots.device)[:, None], slots]

    def slot_of(self, origin: Tensor, node: Tensor) -> Tensor:
        """Slot of tree node `node` (an id; -1: the root of hypothesis `origin`)."""
        nodes = self.node_slots.flatten(1)
        own_root = self.root_slots.gather(1, origin)
        if nodes.size(1) == 0:  # no tree (plain search): every hypothesis is at a root
            return own_root
        return torch.where(node < 0, own_root, nodes.gather(1, node.clamp(min=0)))

    def path_slots(self, origin: Tensor, node: Tensor) -> Tensor:
        """(S, k, L): the slots of each new hypothesis' verified path (its origin's
        pending chain, then tree nodes down to `node`) in order, right-aligned, -1 before."""
        table = self.table
        slot = self.slot_of(origin, node)
        ext = native.module_for(slot)
        if ext is not None:  # compiled (csrc/slots.cpp): the same slots
            return ext.path_slots(table.visible, table.size, slot)
        rows = torch.arange(slot.size(0), device=slot.device)[:, None]
        visible = table.visible[rows, slot, : table.size]
        slots = torch.arange(table.size, device=slot.device)
        order = torch.where(visible, slots, -1).sort(-1).values
        return order[..., -int(visible.sum(-1).max()) :]


@final
class Verifier:
    def __init__(self, decoder: TreeDecoder) -> None:
        self.decoder = decoder

    def verify(self, chains: Tensor, chain_len: Tensor, tree: DraftTree) -> Verification:
        """chains: (S, n, c) pending tokens per hypothesis (the root last)."""
        num_sources, n, c = chains.shape
        table = SlotTable(num_sources, n * c + tree.depth * tree.width, chains.device)
        roots = table.add_chains(chains, chain_len, self.decoder.cache.lens)
        chain_slots = roots[..., None] - torch.arange(c - 1, -1, -1, device=roots.device)
        node_slots = tree.add_to(table, roots)
        packing = self.decoder.packing(table.valid[:, : table.size])
        hidden = self.decoder.forward(*table.query(0, table.size), packing=packing)
        # All slots in one projection: at small batches it is bound by reading the
        # (V, M) weights, so projecting per replay step would read them τ times.
        logits = self.decoder.logits(hidden, packing)
        features = self.decoder.features(hidden)
        computed = logits.shape[0] * logits.shape[1] if packing is None else packing.index.numel()
        return Verification(table, chain_slots, node_slots, features, logits, computed)

    def commit(self, verification: Verification, origin: Tensor, node: Tensor) -> None:
        table = verification.table
        slot = verification.slot_of(origin, node)
        if verification.node_slots.size(1) == 0 and verification.chain_slots.size(-1) == 1:
            self.decoder.cache.commit(origin, slot)  # plain search: a root each
            return
        rows = torch.arange(slot.size(0), device=slot.device)[:, None]
        self.decoder.cache.commit(origin, table.visible[rows, slot, : table.size])
