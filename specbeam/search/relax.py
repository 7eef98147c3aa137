"""Relaxed acceptance: keep the draft's children where the target finds them good enough.

Exact acceptance continues only while the target's own top k are all drafted nodes; a
draft that ranks the beam's near-ties differently stops every pass early. Here a step
that fails that test may instead continue with the k best drafted children (by target
score) whose token is among the target's top β for its parent and within a log-prob gap
of the target's best. Scores stay the target's. Not exact: the output can differ from
beam search, so its BLEU is always reported with its speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specbeam.search.tree import DraftTree


@dataclass(frozen=True)
class Relaxation:
    top: int = 3
    """β: a drafted token must be among the target's β best for its parent."""
    gap: float = 2.0
    """And its target log-prob at most this far below the target's best."""


@dataclass
class RelaxedStep:
    ok: Tensor  # (S,) k acceptable children exist
    parent: Tensor  # (S, k) current hypothesis each extends
    token: Tensor  # (S, k)
    score: Tensor  # (S, k) target cumulative scores
    child: Tensor  # (S, k) tree node ids


def relaxed_step(
    relax: Relaxation, lprobs: Tensor, scores: Tensor, key: Tensor, tree: DraftTree, j: int, k: int
) -> RelaxedStep:
    """lprobs (S, n, V): the target's processed log-probs after the current hypotheses,
    scores (S, n) their cumulative scores, key (S, n) their id in level j's `parents`.
    Needs a tree at least k wide."""
    parents, tokens, valid = tree.parents[:, j], tree.tokens[:, j], tree.valid[:, j]  # (S, w)
    match = (parents[:, None, :] == key[..., None]) & valid[:, None, :]  # (S, n, w)
    hyp = match.int().argmax(1)  # (S, w) the current hypothesis each node extends
    own = lprobs.gather(1, hyp[..., None].expand(-1, -1, lprobs.size(-1)))  # (S, w, V)
    lp = own.gather(2, tokens[..., None]).squeeze(-1)
    beta = own.topk(min(relax.top, own.size(-1)), dim=-1).values
    good = match.any(1) & (lp >= beta[..., -1]) & (lp >= beta[..., 0] - relax.gap)
    cum = (scores.gather(1, hyp) + lp).masked_fill(~good, -torch.inf)
    # Equal scores in level order: a stable sort, so that csrc/accept.cpp can match it.
    score, column = (t[:, :k] for t in cum.sort(dim=1, descending=True, stable=True))
    return RelaxedStep(
        ok=(score > -torch.inf).all(1),
        parent=hyp.gather(1, column),
        token=tokens.gather(1, column),
        score=score,
        child=j * tree.width + column,
    )
