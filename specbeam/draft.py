"""Drafting: the draft model proposes a tree of continuations below the live hypotheses.

Strategies (the choice of children per depth; nothing else differs):
- "beam": the draft runs its own beam search of width w from the n live hypotheses,
  scored from their target scores; the union of its trajectories is the tree. It covers
  every step of the target's beam search where the two models agree.
- "linear": every live hypothesis extends its own greedy path (w = n); the right tree
  for greedy search, weak for beams (few steps keep each hypothesis on its greedy path).
"""

from __future__ import annotations

from typing import Literal, final

import torch
from torch import Tensor

from specbeam.rules import ScoringRules
from specbeam.tree import DraftTree
from specbeam.tree_attention import SlotTable, TreeDecoder

DraftStrategy = Literal["beam", "linear"]


@final
class Drafter:
    """Owns the draft model's decoder state: its cache and each hypothesis' pending tokens
    (accepted tokens the draft has not decoded yet, ending with the root)."""

    def __init__(
        self,
        decoder: TreeDecoder,
        rules: ScoringRules,
        prompt: Tensor,
        *,
        strategy: DraftStrategy,
        depth: int,
        width: int,
        max_nodes: int | None = None,
    ) -> None:
        num_sources = decoder.cache.lens.size(0)
        k = decoder.cache.k
        self.decoder = decoder
        self.rules = rules
        self.strategy = strategy
        self.depth = depth
        self.width = width
        self.max_nodes = max_nodes
        # (S, k, c) right-aligned pending chains; all hypotheses of a source share c.
        self.pending = prompt.expand(num_sources, k, -1).clone()
        self.pending_len = torch.full((num_sources,), prompt.size(-1), dtype=torch.int64)
        self.table: SlotTable | None = None
        self.root_slots: Tensor | None = None
        self.passes = 0

    def propose(self, scores: Tensor, n: int) -> DraftTree:
        """scores: (S, n) target scores of the live hypotheses."""
        dec, depth = self.decoder, self.depth
        num_sources, c = scores.size(0), self.pending.size(-1)
        width = n if self.strategy == "linear" else self.width
        table = SlotTable(num_sources, n * c + (depth - 1) * width, scores.device)
        roots = table.add_chains(self.pending[:, :n], self.pending_len, dec.cache.lens)
        hidden = dec.forward(*table.query(0, table.size))
        logits = dec.logits(hidden.gather(1, roots[..., None].expand(-1, -1, hidden.size(-1))))
        tokens, parents, valid, node_scores = [], [], [], []
        parent_slots, cum = roots, scores
        for d in range(depth):
            lprobs = self.rules.log_probs(logits)
            lprobs[..., self.rules.eos_idx] = -torch.inf  # a finished hypothesis needs no draft
            if self.rules.pad_idx is not None:
                lprobs[..., self.rules.pad_idx] = -torch.inf
            score, parent, token = self._children(cum[..., None] + lprobs, width)
            tokens.append(token)
            parents.append(parent)
            node_scores.append(score)
            valid.append(score > -torch.inf)
            if d + 1 < depth:
                begin = table.size
                parent_slots = table.add_nodes(token, parent_slots.gather(1, parent), valid[-1])
                logits = dec.logits(dec.forward(*table.query(begin, table.size)))
                cum = score
        self.table, self.root_slots = table, roots
        self.passes += depth
        tree = DraftTree(*(torch.stack(x, 1) for x in (tokens, parents, valid, node_scores)))
        return tree if self.max_nodes is None else tree.limit(self.max_nodes)

    def _children(self, cand: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
        """cand: (S, m, V) cumulative scores -> score, parent index, token; each (S, width)."""
        num_sources, m, vocab = cand.shape
        if self.strategy == "linear":
            score, token = cand.max(-1)
            return score, torch.arange(m).expand(num_sources, m), token
        score, index = cand.flatten(1).topk(min(width, m * vocab))
        return score, index // vocab, index % vocab

    def commit(self, origin: Tensor, node: Tensor, roots: Tensor, tree: DraftTree) -> None:
        """origin, node, roots: (S, k), see `Acceptance`. The draft has decoded every
        tree level but the deepest; a path ending there leaves that node pending."""
        assert self.table is not None and self.root_slots is not None
        table, width, chain = (
            self.table,
            tree.width,
            self.root_slots.size(1) * self.pending.size(-1),
        )
        deepest = node >= (self.depth - 1) * width
        last = torch.where(deepest, _parent_id(tree, node), node)
        slot = torch.where(
            last < 0,
            self.root_slots.gather(1, origin),
            chain + last,
        )
        rows = torch.arange(slot.size(0))[:, None]
        self.decoder.cache.commit(origin, table.visible[rows, slot, : table.size])
        pending_node = tree.tokens.flatten(1).gather(1, node.clamp(min=0))
        self.pending = torch.stack([pending_node, roots], dim=-1)
        self.pending_len = 1 + deepest[:, 0].long()
        self.table = self.root_slots = None

    def select_sources(self, keep: Tensor) -> None:
        self.decoder.select_sources(keep)
        self.pending = self.pending.index_select(0, keep)
        self.pending_len = self.pending_len.index_select(0, keep)


def _parent_id(tree: DraftTree, node: Tensor) -> Tensor:
    """Id of a node's parent node, -1 where the parent is a live hypothesis."""
    width = tree.width
    depth = node.clamp(min=0) // width
    parent_b = tree.parents.flatten(1).gather(1, node.clamp(min=0))
    return torch.where(depth > 0, (depth - 1) * width + parent_b, -1)
