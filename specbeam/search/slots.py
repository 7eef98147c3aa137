"""The slots of one decoder call: every source's new tokens (pending chains and drafted
nodes), their positions, the prefix each extends, and who may attend to whom."""

from __future__ import annotations

from typing import final

import torch
from torch import Tensor

from specbeam.kernels import native


@final
class SlotTable:
    """The speculative slots of one model in one round, and who may attend to whom.

    A slot is one new token of one source: a link of a hypothesis' pending chain (its
    last token, the root, is the chain's end) or a drafted tree node. `visible[s, a, b]`
    says slot b is an ancestor-or-self of slot a; slots are added in dependency order.
    """

    def __init__(self, num_sources: int, max_slots: int, device: torch.device) -> None:
        shape = (num_sources, max_slots)
        self.tokens = torch.zeros(shape, dtype=torch.int64, device=device)
        self.positions = torch.zeros(shape, dtype=torch.int64, device=device)
        self.hyp = torch.zeros(shape, dtype=torch.int64, device=device)  # prefix it extends
        self.valid = torch.zeros(shape, dtype=torch.bool, device=device)
        self.visible = torch.zeros(
            (num_sources, max_slots, max_slots), dtype=torch.bool, device=device
        )
        self.size = 0

    def add_chains(self, tokens: Tensor, lengths: Tensor, start_positions: Tensor) -> Tensor:
        """Adds each hypothesis' pending tokens as a chain, right-aligned so that every
        root lands in the chain's last slot.

        tokens: (S, n, c) right-aligned; lengths: (S,) valid links per chain (the same
        for every hypothesis of a source); start_positions: (S,) position of the first
        valid link. Returns the root slots, (S, n).
        """
        num_sources, n, c = tokens.shape
        device = tokens.device
        begin = self.size
        ext = native.module_for(tokens)
        if ext is not None:  # compiled (csrc/slots.cpp): the same writes
            roots = ext.add_chains(self.tensors(), begin, tokens, lengths, start_positions)
            self.size += n * c
            return roots
        if c == 1:  # the roots alone (every pass after the first): each sees itself
            slots = slice(begin, begin + n)
            self.tokens[:, slots] = tokens[..., 0]
            self.positions[:, slots] = (start_positions + lengths - 1)[:, None]
            self.hyp[:, slots] = torch.arange(n, device=device)
            self.valid[:, slots] = lengths[:, None] > 0
            self.visible[:, slots, slots] = torch.eye(n, dtype=torch.bool, device=device)
            self.size += n
            return begin + torch.arange(n, device=device).expand(num_sources, n)
        link = torch.arange(c, device=device)
        valid = link[None, :] >= (c - lengths)[:, None]  # (S, c)
        slots = slice(begin, begin + n * c)
        self.tokens[:, slots] = tokens.flatten(1)
        self.positions[:, slots] = (
            start_positions[:, None] + link - (c - lengths)[:, None]
        ).repeat(1, n)
        self.hyp[:, slots] = torch.arange(n, device=device).repeat_interleave(c)
        self.valid[:, slots] = valid.repeat(1, n)
        # A link sees the valid links of its own chain up to itself.
        chain = (link[:, None] >= link[None, :]) & valid[:, None, :]  # (S, c, c)
        block = torch.block_diag(*[torch.ones(c, c, dtype=torch.bool, device=device)] * n)
        eye = torch.eye(n * c, dtype=torch.bool, device=device)  # padding sees itself: no NaN
        self.visible[:, slots, slots] = (block & chain.repeat(1, n, n)) | eye
        self.size += n * c
        return begin + torch.arange(n, device=device).mul(c).add(c - 1).expand(num_sources, n)

    def add_nodes(self, tokens: Tensor, parents: Tensor, valid: Tensor) -> Tensor:
        """Adds one block of children; parents are slot indices. Returns their slots."""
        num_sources, w = tokens.shape
        ext = native.module_for(tokens)
        if ext is not None:  # compiled (csrc/slots.cpp): the same writes
            slots = ext.add_nodes(self.tensors(), self.size, tokens, parents, valid)
            self.size += w
            return slots
        begin, rows = self.size, torch.arange(num_sources, device=tokens.device)[:, None]
        slots = torch.arange(begin, begin + w, device=tokens.device)
        self.tokens[:, slots] = tokens
        self.positions[:, slots] = self.positions[rows, parents] + 1
        self.hyp[:, slots] = self.hyp[rows, parents]
        self.valid[:, slots] = valid & self.valid[rows, parents]
        self.visible[:, slots] = self.visible[rows, parents]
        self.visible[:, slots, slots] = True
        self.size += w
        return slots.expand(num_sources, w)

    def tensors(self) -> list[Tensor]:
        """The tables the compiled writes fill in place, in their order."""
        return [self.tokens, self.positions, self.hyp, self.valid, self.visible]

    def query(self, begin: int, end: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Tokens, positions, hypotheses and visibility (over slots < end) of slots [begin, end)."""
        s = slice(begin, end)
        return self.tokens[:, s], self.positions[:, s], self.hyp[:, s], self.visible[:, s, :end]
