"""Drafting: the draft model proposes a tree of continuations below the live hypotheses.

Strategies (the choice of children per depth; nothing else differs):
- "beam": the draft runs its own beam search of width w from the n live hypotheses,
  scored from their target scores; the union of its trajectories is the tree. It covers
  every step of the target's beam search where the two models agree.
- "linear": every live hypothesis extends its own greedy path (w = n); the right tree
  for greedy search, weak for beams (few steps keep each hypothesis on its greedy path).
- "topm": every node branches into the draft's m best tokens for the first levels, and
  only where the draft is unsure (its best token's probability below a threshold); the
  w best of those by cumulative score stay. Branching where the draft is sure wastes
  verified slots on children the target's beam will not take.
Any strategy may prune nodes that score far below the k-th best of their level: the
target's beam keeps k per step, so such nodes are unlikely to be on its path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal, Protocol, final

import torch
from fairseq2.nn import Projection
from torch import Tensor

from specbeam.kernels.onednn import project
from specbeam.search.rules import ScoringRules
from specbeam.search.slots import SlotTable
from specbeam.search.tree import DraftTree
from specbeam.search.tree_attention import TreeDecoder
from specbeam.search.verify import Verification

DraftStrategy = Literal["beam", "linear", "topm"]
ChooseChildren = Callable[[Tensor, int, int], tuple[Tensor, Tensor, Tensor]]
"""(cand (S, m, V) cumulative scores, width, level) -> score, parent, token; (S, width)."""


class PassGate(Protocol):
    """Chooses per pass and source whether the tree below the first level is worth
    verifying (`planner.Gate`): a source it turns off takes a plain step."""

    def depths(self, confidence: Tensor, depths: Tensor) -> Tensor:
        """confidence, depths (S,): each source's depth this pass, 0 where off."""

    def observe(self, confidence: Tensor, depths: Tensor, steps: Tensor) -> None:
        """The steps (S,) each source advanced at the depths `depths` chose."""


DRAFT_STRATEGIES: tuple[str, ...] = ("beam", "linear", "topm")


@dataclass(frozen=True)
class DraftShape:
    """How the tree is drawn; exactness does not depend on it, only τ and cost."""

    strategy: DraftStrategy = "beam"
    depth: int = 4
    width: int = 5
    """beam, topm: nodes kept per level (linear: one per live hypothesis)."""
    branch: int = 2
    """topm: children per branching node."""
    branch_depth: int = 1
    """topm: levels that may branch; deeper levels continue greedily."""
    branch_below: float = 1.0
    """topm: branch only below nodes whose best draft token has probability < this."""
    prune_margin: float | None = None
    """Drop nodes whose cumulative draft score is more than this below the k-th best
    of their level."""
    max_nodes: int | None = None
    """Keep each source's most likely nodes (by draft score)."""
    beam_size: int = 5
    depth_bounds: tuple[int, int] | None = None
    """Adapt each source's depth within these bounds (from `depth`) to the steps it
    advanced per pass; None: always `depth`."""
    vocab: int | None = None
    """Draft from the head's `vocab` most frequent target-side tokens only (FR-Spec);
    None: all the tokens a head ranks (the whole vocabulary for a draft without a
    ranking); 0: the whole vocabulary. The target still verifies over all of it."""

    @property
    def max_depth(self) -> int:
        return self.depth if self.depth_bounds is None else self.depth_bounds[1]

    def shrunk(self, max_depth: int, width: int) -> DraftShape:
        """At most `max_depth` levels (adaptive bounds included) and `width` nodes each."""
        bounds = self.depth_bounds
        if bounds is not None:
            bounds = (min(bounds[0], max_depth), min(bounds[1], max_depth))
        return replace(self, depth=min(self.depth, max_depth), width=width, depth_bounds=bounds)

    def at_depth(self, depth: int) -> DraftShape:
        """This shape at a fixed `depth`."""
        return replace(self, depth=depth, depth_bounds=None)

    def problems(self) -> list[tuple[str, object, str]]:
        """(keyword, value, what is allowed) of every setting out of range."""
        checks = [
            ("draft_strategy", self.strategy, self.strategy in DRAFT_STRATEGIES, f"one of {DRAFT_STRATEGIES}"),
            ("gamma", self.depth, self.depth >= 1, "≥ 1"),
            ("draft_width", self.width, self.width >= (self.beam_size if self.strategy == "beam" else 1), f"≥ beam_size ({self.beam_size})"),
            ("draft_branch", self.branch, self.branch >= 1, "≥ 1"),
            ("draft_branch_depth", self.branch_depth, self.branch_depth >= 0, "≥ 0"),
            ("draft_branch_below", self.branch_below, 0.0 < self.branch_below <= 1.0, "in (0, 1]"),
            ("draft_prune_margin", self.prune_margin, self.prune_margin is None or self.prune_margin >= 0, "≥ 0 or None"),
            ("max_draft_nodes", self.max_nodes, self.max_nodes is None or self.max_nodes >= max(self.depth, 1), f"≥ gamma ({self.depth}) or None: a smaller budget cannot hold one drafted path"),
            ("draft_vocab", self.vocab, self.vocab in (None, 0) or self.vocab >= self.width, f"≥ draft_width ({self.width}), 0 or None"),
            ("gamma_bounds", self.depth_bounds, self.depth_bounds is None or 1 <= self.depth_bounds[0] <= self.depth <= self.depth_bounds[1], f"[lo, hi] with 1 ≤ lo ≤ gamma ({self.depth}) ≤ hi, or None"),
        ]  # fmt: skip
        return [(name, value, allowed) for name, value, ok, allowed in checks if not ok]


@final
class Drafter:
    """Owns the draft model's decoder state: its cache and each hypothesis' pending tokens
    (accepted tokens the draft has not decoded yet, ending with the root)."""

    def __init__(
        self,
        decoder: TreeDecoder,
        rules: ScoringRules,
        prompt: Tensor,
        shape: DraftShape,
        choose: ChooseChildren | None = None,
        gate: PassGate | None = None,
    ) -> None:
        """`choose` replaces the shape's choice of children (speculative sampling draws
        them); `gate` turns speculation off per pass and source."""
        num_sources = decoder.cache.lens.size(0)
        k = decoder.cache.k
        self.decoder = decoder
        self.rules = rules
        self.shape = shape
        self.choose: ChooseChildren = choose or partial(children, shape)
        # (S, k, c) right-aligned pending chains; all hypotheses of a source share c.
        self.pending = prompt.expand(num_sources, k, -1).clone()
        self.pending_len = torch.full(
            (num_sources,), prompt.size(-1), dtype=torch.int64, device=prompt.device
        )
        # A draft head's parent states for the pending chains, (S, k, c, M). No state
        # precedes the prompt's tokens (the target has not run yet): they read zeros,
        # as in the head's training.
        self.pending_features: Tensor | None = None
        if decoder.reads_features:
            dim = decoder.model.model_dim
            self.pending_features = self.pending.new_zeros(
                (*self.pending.shape, dim), dtype=decoder.dtype
            )
        self.table: SlotTable | None = None
        self.root_slots: Tensor | None = None
        self.passes = 0
        self.depths = torch.full(
            (num_sources,), shape.depth, dtype=torch.int64, device=prompt.device
        )
        self.gate = gate
        # The last pass's first-level confidence and depths, for the gate to learn from.
        self.confidence: Tensor | None = None
        self.drafted = self.depths
        # FR-Spec: a head drafts over its most frequent target-side tokens; a finished
        # hypothesis needs no draft, so EOS and padding are never among them.
        self.vocab: Tensor | None = None
        self.proj: Projection | None = None
        head, size = decoder.head, shape.vocab
        if size is None and head is not None and head.vocab is not None:
            size = len(head.vocab)
        if size:
            if head is None:
                raise ValueError("`draft_vocab` needs a draft head, not a draft decoder")
            special = tuple(t for t in (rules.eos_idx, rules.pad_idx) if t is not None)
            self.vocab, self.proj = head.draft_projection(size, special)

    def _logits(self, states: Tensor) -> Tensor:
        if self.proj is None:
            return self.decoder.logits(states)
        return project(states, self.proj)

    def width(self, n: int) -> int:
        return n if self.shape.strategy == "linear" else self.shape.width

    def propose(self, scores: Tensor, n: int) -> DraftTree:
        """scores: (S, n) target scores of the live hypotheses."""
        dec, depth = self.decoder, int(self.depths.max())
        num_sources, c = scores.size(0), self.pending.size(-1)
        width = self.width(n)
        table = SlotTable(num_sources, n * c + (depth - 1) * width, scores.device)
        roots = table.add_chains(self.pending[:, :n], self.pending_len, dec.cache.lens)
        chain_features = (
            None if self.pending_features is None else self.pending_features[:, :n].flatten(1, 2)
        )
        hidden = dec.forward(
            *table.query(0, table.size),
            features=chain_features,
            packing=dec.packing(table.valid[:, : table.size]),
        )
        # The states of the last level's nodes (S, m, M): the roots first.
        level = hidden.gather(1, roots[..., None].expand(-1, -1, hidden.size(-1)))
        logits = self._logits(level)
        tokens, parents, valid, node_scores = [], [], [], []
        parent_slots, cum, depths = roots, scores, self.depths
        for d in range(depth):
            lprobs = self.rules.log_probs(logits)
            if self.vocab is None:
                lprobs[..., self.rules.eos_idx] = -torch.inf  # a finished hypothesis needs no draft
                if self.rules.pad_idx is not None:
                    lprobs[..., self.rules.pad_idx] = -torch.inf
            score, parent, token = self.choose(cum[..., None] + lprobs, width, d)
            if d == 0 and self.gate is not None:
                self.confidence = first_level_mass(cum, score)
                depths = self.gate.depths(self.confidence, self.depths)
                depth = int(depths.max())
                if depth == 0:  # a plain step for every source: the draft has decoded its chains
                    return self._no_tree(table, roots, depths)
            if self.vocab is not None:
                token = self.vocab[token]
            if self.shape.prune_margin is not None:
                kth = score.topk(min(self.shape.beam_size, score.size(1)), dim=1).values[:, -1:]
                score = score.masked_fill(score < kth - self.shape.prune_margin, -torch.inf)
            # Sources drafting no deeper leave no nodes for the draft calls to decode.
            score = score.masked_fill((depths <= d)[:, None], -torch.inf)
            tokens.append(token)
            parents.append(parent)
            node_scores.append(score)
            valid.append(score > -torch.inf)
            if d + 1 == depth:
                break
            begin = table.size
            features = (
                level.gather(1, parent[..., None].expand(-1, -1, level.size(-1)))
                if dec.reads_features
                else None
            )
            parent_slots = table.add_nodes(token, parent_slots.gather(1, parent), valid[-1])
            level = dec.forward(
                *table.query(begin, table.size),
                features=features,
                packing=dec.packing(table.valid[:, begin : table.size]),
            )
            logits = self._logits(level)
            cum = score
        self.table, self.root_slots = table, roots
        self.passes += depth
        self.drafted = depths
        drafted = torch.arange(depth, device=depths.device) < depths[:, None]  # (S, D)
        valid_levels = torch.stack(valid, 1) & drafted[..., None]
        tree = DraftTree(
            *(torch.stack(x, 1) for x in (tokens, parents)),
            valid_levels,
            torch.stack(node_scores, 1),
        )
        return tree if self.shape.max_nodes is None else tree.limit(self.shape.max_nodes)

    def _no_tree(self, table: SlotTable, roots: Tensor, depths: Tensor) -> DraftTree:
        self.table, self.root_slots = table, roots
        self.passes += 1
        self.drafted = depths
        return DraftTree.empty(roots.size(0), roots.device)

    def commit(
        self,
        origin: Tensor,
        node: Tensor,
        roots: Tensor,
        tree: DraftTree,
        verification: Verification,
    ) -> None:
        """origin, node, roots: (S, k), see `Acceptance`. The draft has decoded every
        tree level but the deepest; a path ending there leaves that node pending."""
        if self.decoder.reads_features:
            self._commit_head(origin, node, roots, verification)
            return
        assert self.table is not None and self.root_slots is not None
        table, width, chain = (
            self.table,
            tree.width,
            self.root_slots.size(1) * self.pending.size(-1),
        )
        if tree.depth == 0:  # a plain step: the draft decoded the chains, every path ends at a root
            deepest, last = node >= 0, node
        else:
            deepest = node >= (tree.depth - 1) * width
            last = torch.where(deepest, _parent_id(tree, node), node)
        slot = torch.where(
            last < 0,
            self.root_slots.gather(1, origin),
            chain + last,
        )
        rows = torch.arange(slot.size(0), device=slot.device)[:, None]
        self.decoder.cache.commit(origin, table.visible[rows, slot, : table.size])
        pending_node = tree.tokens.flatten(1).gather(1, node.clamp(min=0)) if tree.depth else roots
        self.pending = torch.stack([pending_node, roots], dim=-1)
        self.pending_len = 1 + deepest[:, 0].long()
        self.table = self.root_slots = None

    def _commit_head(
        self, origin: Tensor, node: Tensor, roots: Tensor, verification: Verification
    ) -> None:
        """A head keeps each origin's pending chain, decoded already. Its tree was decoded
        from the head's own predicted states, so the accepted nodes are decoded again,
        from the states verification computed for their parents: the next pending chain
        (the nodes, then the new root)."""
        assert self.table is not None and self.root_slots is not None
        rows = torch.arange(origin.size(0), device=origin.device)[:, None]
        keep = self.table.visible[rows, self.root_slots.gather(1, origin), : self.table.size]
        self.decoder.cache.commit(origin, keep)
        path = verification.path_slots(origin, node)  # (S, k, L): c chain links, then nodes
        c = verification.chain_slots.size(-1)
        rows3 = rows[..., None]
        tokens = verification.table.tokens[rows3, path[..., c:].clamp(min=0)]
        states = verification.features[rows3, path[..., c - 1 :].clamp(min=0)]
        self.pending = torch.cat([tokens, roots[..., None]], dim=-1)
        head = self.decoder.head
        assert head is not None
        self.pending_features = head.fuse_features(states).to(self.decoder.dtype)
        self.pending_len = (path[:, 0] >= 0).sum(-1) - c + 1
        self.table = self.root_slots = None

    def adapt(self, steps: Tensor) -> None:
        """steps: (S,) beam-search steps each source advanced in the last pass. A source
        that took every level drafts one deeper; else halfway down to the steps it took.
        A source the gate turned off keeps its depth: a plain step says nothing of it."""
        if self.gate is not None and self.confidence is not None:
            self.gate.observe(self.confidence, self.drafted, steps)
        if self.shape.depth_bounds is None:
            return
        lo, hi = self.shape.depth_bounds
        want = torch.where(steps > self.drafted, self.depths + 1, (self.depths + steps) // 2)
        self.depths = torch.where(self.drafted > 0, want.clamp(lo, hi), self.depths)

    def select_sources(self, keep: Tensor) -> None:
        self.decoder.select_sources(keep)
        self.depths = self.depths.index_select(0, keep)
        self.drafted = self.drafted.index_select(0, keep)
        self.pending = self.pending.index_select(0, keep)
        self.pending_len = self.pending_len.index_select(0, keep)
        if self.pending_features is not None:
            self.pending_features = self.pending_features.index_select(0, keep)


def children(shape: DraftShape, cand: Tensor, width: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """The nodes of level d: cand (S, m, V) cumulative scores of the m parents' children ->
    score, parent index, token; each (S, width)."""
    num_sources, m, vocab = cand.shape
    strategy = shape.strategy
    if strategy == "linear" or (strategy == "topm" and d >= shape.branch_depth):
        score, token = cand.max(-1)
        parent = torch.arange(m, device=cand.device).expand(num_sources, m)
        return _best(score, parent, token, width)
    if strategy == "beam":
        score, index = cand.flatten(1).topk(min(width, m * vocab))
        return score, index // vocab, index % vocab
    branch = min(shape.branch, vocab)
    score, token = cand.topk(branch, dim=-1)  # (S, m, branch)
    if shape.branch_below < 1.0:
        # The parent's score cancels: this is the draft's probability of its best token.
        sure = (score[..., 0] - cand.logsumexp(-1)).exp() >= shape.branch_below
        score[..., 1:] = score[..., 1:].masked_fill(sure[..., None], -torch.inf)
    parent = torch.arange(m, device=cand.device)[:, None].expand(num_sources, m, branch)
    return _best(score.flatten(1), parent.flatten(1), token.flatten(1), width)


def first_level_mass(scores: Tensor, first: Tensor) -> Tensor:
    """(S,): the draft's probability of one beam step (every extension of every live
    hypothesis, weighted by the hypothesis' score; scores (S, n)) that the tree's first
    level (first (S, w), those extensions' scores) holds. Where it is high the target's
    next beam is likely among them, and deeper levels tend to hold too: of the signals
    before a target call, the one that best predicts the steps a pass advances."""
    return (first.logsumexp(1) - scores.logsumexp(1)).exp().nan_to_num(0.0)


def _best(
    score: Tensor, parent: Tensor, token: Tensor, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The `width` best of (S, c) candidates, padded with invalid ones to exactly `width`."""
    if score.size(1) > width:
        score, keep = score.topk(width, dim=1)
        return score, parent.gather(1, keep), token.gather(1, keep)
    pad = width - score.size(1)
    if pad == 0:
        return score, parent, token
    fill = score.new_full((score.size(0), pad), -torch.inf)
    zeros = parent.new_zeros((score.size(0), pad))
    return torch.cat([score, fill], 1), torch.cat([parent, zeros], 1), torch.cat([token, zeros], 1)


def _parent_id(tree: DraftTree, node: Tensor) -> Tensor:
    """Id of a node's parent node, -1 where the parent is a live hypothesis."""
    width = tree.width
    depth = node.clamp(min=0) // width
    parent_b = tree.parents.flatten(1).gather(1, node.clamp(min=0))
    return torch.where(depth > 0, (depth - 1) * width + parent_b, -1)
