"""Exact acceptance: replay fairseq2's beam search on the verified log-probs.

Step j ranks the extensions of the current hypotheses exactly as
`StandardBeamSearchAlgorithm` does (top 2k cumulative scores, EOS only within the top
k, the first k non-EOS continue). When every continuing hypothesis is a node of the
draft tree, the target's next log-probs for it were verified in the same pass and step
j + 1 follows; otherwise the source stops after step j. So each pass advances every
source by 1 to D + 1 steps, and the result is plain beam search. One exception keeps a
pass going: hypotheses off the tree whose own score (an upper bound on their children's)
is below the k-th non-EOS candidate of step j + 1 cannot affect it.

Beam 1 over a linear draft (spec greedy) ranks all steps of a pass in one batch instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

import torch
from fairseq2.generation import Hypothesis
from torch import Tensor

from specbeam.search.beam import BeamState, HypothesisFactory
from specbeam.search.relax import Relaxation, relaxed_step
from specbeam.search.rules import ScoringRules
from specbeam.search.tree import DraftTree
from specbeam.search.verify import Verification


@dataclass
class Acceptance:
    origin: Tensor  # (S, k) live hypothesis (before the pass) each new one extends
    node: Tensor  # (S, k) deepest tree node on its path (-1: none, only the root)
    roots: Tensor  # (S, k) each new hypothesis' last token: the next pass's root
    steps: Tensor  # (S,) beam-search steps advanced
    accepted: Tensor  # (S,) drafted tokens the beam passed through
    done: Tensor  # (S,) the source has its k finished hypotheses


@final
class BeamAcceptor:
    """Exact by default; with a `Relaxation`, steps the target would take differently may
    also continue (see specbeam/search/relax.py)."""

    def __init__(
        self,
        rules: ScoringRules,
        beam_size: int,
        finish: HypothesisFactory,
        relax: Relaxation | None = None,
    ) -> None:
        self.rules = rules
        self.k = beam_size
        self.finish = finish
        self.relax = relax
        # Children never outscore their parent unless a bonus (negative UNK penalty) or
        # a step processor can raise a log-prob; then every hypothesis must be verified.
        self.bounded = rules.unk_penalty >= 0 and not rules.step_processors

    def score_prompt(self, state: BeamState, verification: Verification, prompt: Tensor) -> None:
        """fairseq2's prefill: cumulative log-probs of the prompts (S, P), temperature only."""
        p = prompt.size(1)
        if p < 2:
            return
        chain = verification.chain_slots[:, 0, :-1]  # (S, p - 1)
        lprobs = self.rules.log_probs(verification.logits_at(chain))
        prompt_scores = lprobs.gather(2, prompt[:, 1:, None]).squeeze(-1)
        state.step_scores[:, :, 1:p] = prompt_scores.cumsum(-1)[:, None]
        state.scores = state.step_scores[:, :1, p - 1].clone()

    def accept(
        self,
        state: BeamState,
        verification: Verification,
        tree: DraftTree,
        output: list[list[Hypothesis]],
    ) -> Acceptance:
        if (
            self.k == 1
            and tree.width == 1
            and self.relax is None
            and not self.rules.step_processors
        ):
            return _accept_chain(self.rules, self.finish, state, verification, tree, output)
        k, width = self.k, tree.width
        num_sources = verification.logits.size(0)
        n = state.n
        origin = torch.arange(n).expand(num_sources, n)
        node = torch.full((num_sources, n), -1)
        slot = verification.root_slots
        scores, seqs, step_scores = state.scores, state.seqs[:, :n], state.step_scores[:, :n]
        active = torch.ones(num_sources, dtype=torch.bool)
        done = torch.zeros(num_sources, dtype=torch.bool)
        steps = torch.zeros(num_sources, dtype=torch.int64)
        accepted = torch.zeros(num_sources, dtype=torch.int64)
        final = (torch.zeros((num_sources, k), dtype=torch.int64), torch.full((num_sources, k), -1), torch.zeros((num_sources, k), dtype=torch.int64))  # fmt: skip
        stop_here = final  # where each source ends if it cannot take the next step
        known = torch.ones((num_sources, n), dtype=torch.bool)  # hypotheses with verified log-probs
        rows = torch.arange(num_sources)[:, None]
        every_slot = None if self.rules.step_processors else _scored(self.rules, verification)
        for j in range(tree.depth + 1):
            step_nr = state.step_nr + j
            if every_slot is None:
                lprobs = self.rules.log_probs(verification.logits_at(slot))  # (S, n, V)
                self.rules.apply(lprobs, step_nr, seqs)
            else:
                lprobs = every_slot[rows, slot]
            vocab = lprobs.size(-1)
            lprobs.masked_fill_(~known[..., None], -torch.inf)
            top, index = (scores[..., None] + lprobs).flatten(1).topk(min(2 * k, lprobs[0].numel()))
            parent, token = index // vocab, index % vocab
            is_eos = token == self.rules.eos_idx
            keep = torch.sort(is_eos.to(torch.int8), dim=1, stable=True).indices[:, :k]
            # A hypothesis off the tree has no verified log-probs, but its children score at
            # most its own score. The step is decided by the candidates up to the k-th
            # non-EOS one: below it, none of those children could change it.
            unknown = (~known).any(-1)
            decisive = top.gather(1, keep[:, -1:]).squeeze(1)
            fits = ~unknown | (scores.masked_fill(known, -torch.inf).amax(-1) < decisive)
            late = active & ~fits
            if late.any():
                for f, s in zip(final, stop_here, strict=True):
                    f[late] = s[late]
                active = active & fits
            finishing = is_eos[:, :k] & active[:, None]
            if finishing.any():
                self._finish(
                    finishing,
                    parent,
                    top,
                    seqs,
                    step_scores,
                    step_nr,
                    state.source_ids,
                    output,
                    done,
                )
            parent, token, top = parent.gather(1, keep), token.gather(1, keep), top.gather(1, keep)
            # Level j's id of each current hypothesis (its index below the roots).
            key = origin if j == 0 else node - (j - 1) * width
            in_tree, child = _in_tree(tree, j, key.gather(1, parent), token)
            go_on = in_tree.all(-1)
            if self.relax is not None and j < tree.depth and width >= k:
                r = relaxed_step(self.relax, lprobs, scores, key, tree, j, k)
                swap = (r.ok & ~go_on)[:, None]
                parent, token = (
                    torch.where(swap, r.parent, parent),
                    torch.where(swap, r.token, token),
                )
                top, child = torch.where(swap, r.score, top), torch.where(swap, r.child, child)
                in_tree |= swap
                go_on |= swap[:, 0]
            if self.bounded:
                go_on |= in_tree.any(-1)  # the next step checks the others are out of reach
            go_on &= active & ~done
            new_seqs, new_step_scores = seqs[rows, parent], step_scores[rows, parent]
            # Sources that stopped earlier in this pass may run past the end; discarded below.
            at = step_nr.clamp(max=seqs.size(-1) - 1)[:, None, None].expand(-1, k, 1)
            new_seqs.scatter_(2, at, token[..., None])
            new_step_scores.scatter_(2, at, top[..., None])
            origin, parent_node = origin.gather(1, parent), node.gather(1, parent)
            stop_here = (origin, parent_node, token)
            stop = active & ~go_on & ~done
            for f, s in zip(final, stop_here, strict=True):
                f[stop] = s[stop]
            steps += active
            accepted += (go_on[:, None] & in_tree).sum(-1)
            update = active[:, None]
            scores = torch.where(update, top, scores)
            seqs = torch.where(update[..., None], new_seqs, seqs)
            step_scores = torch.where(update[..., None], new_step_scores, step_scores)
            known = in_tree | ~go_on[:, None]
            node = torch.where(go_on[:, None] & in_tree, child, parent_node)
            slot = verification.slot_of(origin, node)
            active = go_on
            if not active.any():
                break
        state.seqs, state.step_scores, state.scores = seqs, step_scores, scores
        state.step_nr = state.step_nr + steps
        state.n = k
        return Acceptance(*final, steps=steps, accepted=accepted, done=done)

    def _finish(
        self,
        finishing: Tensor,
        parent: Tensor,
        top: Tensor,
        seqs: Tensor,
        step_scores: Tensor,
        step_nr: Tensor,
        source_ids: Tensor,
        output: list[list[Hypothesis]],
        done: Tensor,
    ) -> None:
        """Moves the EOS candidates in the top k to the output, in rank order, until a
        source has k hypotheses (then it is done, as in fairseq2)."""
        for s, rank in finishing.nonzero().tolist():
            if done[s]:
                continue
            hyp, t = int(parent[s, rank]), int(step_nr[s])
            hyps = output[int(source_ids[s])]
            hyps.append(self.finish(seqs[s, hyp], step_scores[s, hyp], top[s, rank], t))
            if len(hyps) == self.k:
                done[s] = True


def _in_tree(tree: DraftTree, j: int, key: Tensor, token: Tensor) -> tuple[Tensor, Tensor]:
    """Which new hypotheses (their parent's level-j key and token, each (S, k)) are nodes
    of level j, so that their log-probs were verified; and those nodes' ids."""
    if j >= tree.depth:
        return torch.zeros_like(key, dtype=torch.bool), key
    match = (tree.parents[:, j, None, :] == key[..., None]) & (
        tree.tokens[:, j, None, :] == token[..., None]
    )
    match &= tree.valid[:, j, None, :]
    return match.any(-1), j * tree.width + match.int().argmax(-1)


def _scored(rules: ScoringRules, verification: Verification, slots: Tensor | None = None) -> Tensor:
    """The log-probs (S, m, V) of slots (S, m) (None: every slot) with fairseq2's rules
    applied. A slot at position p predicts sequence index p + 1, so the rules need no
    hypothesis' prefix (step processors do), and all replay steps are scored at once."""
    if slots is None:
        lprobs = rules.log_probs(verification.logits)
        step_nr = verification.table.positions[:, : lprobs.size(1)] + 1
    else:
        lprobs = rules.log_probs(verification.logits_at(slots))
        step_nr = verification.table.positions.gather(1, slots) + 1
    rules.apply(lprobs.view(-1, 1, lprobs.size(-1)), step_nr.flatten())
    return lprobs


def _accept_chain(
    rules: ScoringRules,
    finish: HypothesisFactory,
    state: BeamState,
    verification: Verification,
    tree: DraftTree,
    output: list[list[Hypothesis]],
) -> Acceptance:
    """Beam 1 over a linear draft: fairseq2's step j keeps the best non-EOS extension of
    the one hypothesis and finishes it if EOS ranks first. Every step's log-probs were
    verified (the root, then each drafted node), so all γ + 1 steps are ranked in one
    batch: the pass keeps the leading steps that chose the drafted token, then the
    target's own choice. No step processors: they need each step's prefix."""
    num_sources, depth = tree.tokens.shape[:2]
    slots = torch.cat([verification.root_slots, verification.node_slots[..., 0]], 1)  # (S, D+1)
    lprobs = _scored(rules, verification, slots)  # (S, D+1, V)
    drafted = tree.tokens[..., 0]  # (S, D)
    # Path scores by fp32 additions in step order, as the step-by-step search adds them
    # (a cumsum may accumulate differently).
    path = [state.scores[:, 0]]
    drafted_lprobs = lprobs[:, :depth].gather(2, drafted[..., None]).squeeze(-1)
    for d in range(depth):
        path.append(path[-1] + drafted_lprobs[:, d])
    top, token = (torch.stack(path, 1)[..., None] + lprobs).topk(2)  # (S, D+1, 2)
    is_eos = token[..., 0] == rules.eos_idx
    # The best non-EOS candidate continues; an EOS in first place finishes the hypothesis.
    choice, score = (torch.where(is_eos, t[..., 1], t[..., 0]) for t in (token, top))
    match = tree.valid[..., 0] & ~is_eos[:, :depth] & (choice[:, :depth] == drafted)
    accepted = match.int().cumprod(1).sum(1)  # (S,) leading drafted steps kept
    steps = accepted + 1
    last = accepted[:, None]
    finished = is_eos.gather(1, last).squeeze(1)
    # Steps up to `accepted` write their choice (the drafted token, then the target's).
    seqs, step_scores = state.seqs[:, 0], state.step_scores[:, 0]  # (S, L)
    at = (state.step_nr[:, None] + torch.arange(depth + 1)).clamp(max=seqs.size(1) - 1)
    write = torch.arange(depth + 1) <= last
    seqs.scatter_(1, at, torch.where(write, choice, seqs.gather(1, at)))
    step_scores.scatter_(1, at, torch.where(write, score, step_scores.gather(1, at)))
    end = state.step_nr + accepted
    eos_score = top[..., 0].gather(1, last).squeeze(1)
    for s in finished.nonzero().squeeze(1).tolist():
        t = int(end[s])
        output[int(state.source_ids[s])].append(finish(seqs[s], step_scores[s], eos_score[s], t))
    state.scores = score.gather(1, last)
    state.step_nr = state.step_nr + steps
    return Acceptance(
        origin=torch.zeros((num_sources, 1), dtype=torch.int64),
        node=last - 1,
        roots=choice.gather(1, last),
        steps=steps,
        accepted=accepted,
        done=finished,
    )
