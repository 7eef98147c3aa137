"""Exact acceptance: replay fairseq2's beam search on the verified log-probs.

Step j ranks the extensions of the current hypotheses exactly as
`StandardBeamSearchAlgorithm` does (top 2k cumulative scores, EOS only within the top
k, the first k non-EOS continue). When every continuing hypothesis is a node of the
draft tree, the target's next log-probs for it were verified in the same pass and step
j + 1 follows; otherwise the source stops after step j. So each pass advances every
source by 1 to D + 1 steps, and the result is plain beam search. One exception keeps a
pass going: hypotheses off the tree whose own score (an upper bound on their children's)
is below the k-th non-EOS candidate of step j + 1 cannot affect it.

The vocabulary-wide work (log-softmax of every slot once, adding scores, the top 2k)
runs in torch; the bookkeeping on (S, k)-sized arrays runs in numpy, whose ops cost under
a microsecond against torch's 2-5 µs of dispatch (a pass at beam 5 and γ 2 makes about
150 of them). Each step keeps its parents, tokens and scores; the hypotheses' tokens and
scores are written once, at the end (`_Replay`). Beam 1 over a linear draft (spec
greedy) ranks all steps of a pass in one batch instead.

Where the native extension is built (`specbeam.search.native`) and neither a relaxation
nor step processors take part, all of it runs compiled (csrc/accept.cpp), scoring only the
slots the replay reads: at beam 5, γ 2 and batch 1, 0.60 ms a pass instead of 1.44 (AMD
EPYC Zen 4, 53 test verses), 0.26 ms instead of 0.45 a plain step. The Python loops
remain for the rest, and the tests hold both to the same output.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import final

import numpy as np
import torch
from fairseq2.generation import Hypothesis
from torch import Tensor

from specbeam.search import native
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
        ext = native.module() if self.relax is None and not self.rules.step_processors else None
        if ext is not None:
            return self._accept_compiled(ext, state, verification, tree, output)
        if (
            self.k == 1
            and tree.width == 1
            and self.relax is None
            and not self.rules.step_processors
        ):
            return _accept_chain(self.rules, self.finish, state, verification, tree, output)
        if tree.depth == 0 and verification.logits.size(1) == state.n and not self.rules.step_processors:  # fmt: skip
            return self._accept_roots(state, verification, output)
        return self._accept_tree(state, verification, tree, output)

    def _accept_compiled(
        self,
        ext: ModuleType,
        state: BeamState,
        verification: Verification,
        tree: DraftTree,
        output: list[list[Hypothesis]],
    ) -> Acceptance:
        """The replay (`_accept_tree`, which `_accept_roots` and `_accept_chain` shorten)
        compiled: csrc/accept.cpp scores only the slots the replay reads and returns the
        hypotheses' tokens and the finished ones; here they go into the state and output."""
        rules, num_slots = self.rules, verification.logits.size(1)
        finished = torch.tensor([len(output[i]) for i in state.source_ids.tolist()])
        seqs, step_scores, scores, origin, node, roots, steps, accepted, done, *events = ext.accept(
            verification.logits, verification.root_slots, verification.node_slots, tree.tokens,
            tree.parents, tree.valid, verification.table.positions[:, :num_slots], state.scores,
            state.seqs, state.step_scores, state.step_nr, finished, self.k,
            [rules.eos_idx, _id(rules.pad_idx), _id(rules.unk_idx), rules.min_seq_len, rules.max_seq_len],
            [rules.unk_penalty, rules.temperature], self.bounded,
        )  # fmt: skip
        for s, t, seq, cum_scores, score in zip(*events, strict=True):
            hyp = self.finish(seq, cum_scores, score.clone(), int(t))
            output[int(state.source_ids[s])].append(hyp)
        state.seqs, state.step_scores, state.scores = seqs, step_scores, scores
        state.step_nr = state.step_nr + steps
        state.n = self.k
        return Acceptance(origin, node, roots, steps, accepted, done)

    def _accept_roots(
        self, state: BeamState, verification: Verification, output: list[list[Hypothesis]]
    ) -> Acceptance:
        """Plain beam search (no tree, one slot per hypothesis: its root): fairseq2's
        step once, as the replay's first step computes it, without the replay."""
        k, n = self.k, state.n
        lprobs = _scored(self.rules, verification)  # (S, n, V): slot i is hypothesis i
        num_sources, _, vocab = lprobs.shape
        cand = (state.scores[..., None] + lprobs).flatten(1)
        top, index, token, is_eos, keep = _ranked(cand, k, vocab, self.rules.eos_idx)
        done = np.zeros(num_sources, dtype=bool)
        finishing = is_eos[:, :k]
        if finishing.any():
            seqs, step_scores = state.seqs[:, :n], state.step_scores[:, :n]
            self._finish(finishing, index // vocab, top, seqs, step_scores, state.step_nr, state.source_ids, output, done)  # fmt: skip
        sources = np.arange(num_sources)[:, None]
        index, top = index[sources, keep], top[sources, keep]
        parent, token = torch.from_numpy(index // vocab), torch.from_numpy(token[sources, keep])
        length = state.seqs.size(-1)
        rows = parent[..., None].expand(-1, -1, length)
        state.seqs, state.step_scores = (
            state.seqs.gather(1, rows),
            state.step_scores.gather(1, rows),
        )
        at = state.step_nr.clamp(max=length - 1)[:, None, None].expand(-1, k, 1)
        state.seqs.scatter_(2, at, token[..., None])
        state.scores = torch.from_numpy(top)
        state.step_scores.scatter_(2, at, state.scores[..., None])
        state.step_nr = state.step_nr + 1
        state.n = k
        ones = torch.ones(num_sources, dtype=torch.int64, device=state.step_nr.device)
        return Acceptance(
            origin=parent,
            node=torch.full_like(parent, -1),
            roots=token,
            steps=ones,
            accepted=torch.zeros_like(ones),
            done=torch.from_numpy(done),
        )

    def _accept_tree(
        self,
        state: BeamState,
        verification: Verification,
        tree: DraftTree,
        output: list[list[Hypothesis]],
    ) -> Acceptance:
        k, width, n = self.k, tree.width, state.n
        num_sources, num_slots, vocab = verification.logits.shape
        every_slot = None if self.rules.step_processors else _scored(self.rules, verification)
        # Row r of the replay: live hypothesis r < n, else tree node r - n; its slot, as
        # an index into the flattened (S * T, V) log-probs.
        slots = torch.cat([verification.root_slots, verification.node_slots.flatten(1)], 1)
        flat_slots = (slots + torch.arange(num_sources)[:, None] * num_slots).numpy()  # (S, R)
        keys = _node_keys(tree, n, vocab)  # (S, R)
        replay = _Replay(state)
        sources = np.arange(num_sources)[:, None]
        scores = state.scores.numpy()
        row = np.tile(np.arange(n), (num_sources, 1))  # (S, h) -1: off the tree, not verified
        last = row  # the deepest verified row on each hypothesis' path
        active = np.ones(num_sources, dtype=bool)
        done = np.zeros(num_sources, dtype=bool)
        accepted = np.zeros(num_sources, dtype=np.int64)
        for j in range(tree.depth + 1):
            # row -1 reads some row: masked below.
            at_slot = torch.from_numpy(flat_slots[sources, np.maximum(row, 0)])
            if every_slot is None:
                logits = verification.logits.flatten(0, 1).index_select(0, at_slot.flatten())
                lprobs = self.rules.log_probs(logits).view(num_sources, -1, vocab)
                self.rules.apply(lprobs, state.step_nr + j, replay.prefixes()[0])
            else:
                lprobs = every_slot.flatten(0, 1).index_select(0, at_slot.flatten())
                lprobs = lprobs.view(num_sources, -1, vocab)  # (S, h, V)
            off = row < 0
            some_off = j > 0 and bool(off.any())
            bases = np.where(off, np.float32(-np.inf), scores) if some_off else scores
            cand = (torch.from_numpy(bases)[..., None] + lprobs).flatten(1)
            top, index, token, is_eos, keep = _ranked(cand, k, vocab, self.rules.eos_idx)
            if some_off:
                # A hypothesis off the tree has no verified log-probs, but its children
                # score at most its own score. The step is decided by the candidates up to
                # the k-th non-EOS one: below it, none of those children could change it.
                decisive = top[sources[:, 0], keep[:, -1]]
                reach = np.where(off, scores, -np.inf).max(-1)
                active &= ~off.any(-1) | (reach < decisive)  # else the pass ends before j
            finishing = is_eos[:, :k] & active[:, None]
            if finishing.any():
                seqs, step_scores, _ = replay.prefixes()
                self._finish(finishing, index // vocab, top, seqs, step_scores, state.step_nr + j, state.source_ids, output, done)  # fmt: skip
            index, token, top = index[sources, keep], token[sources, keep], top[sources, keep]
            parent = index // vocab
            # A node's key is its parent's row and its token; an off-tree parent has none.
            key = row[sources, parent] * vocab + token
            match = key[..., None] == keys[:, None, :]  # (S, k, R)
            in_tree, child = match.any(-1), match.argmax(-1)  # child: a row
            go_on = in_tree.all(-1)
            if self.relax is not None and j < tree.depth and width >= k:
                level = row if j == 0 else row - n - (j - 1) * width  # ids in level j's parents
                r = relaxed_step(
                    self.relax,
                    lprobs,
                    torch.from_numpy(scores),
                    torch.from_numpy(level),
                    tree,
                    j,
                    k,
                )
                swap = (r.ok.numpy() & ~go_on)[:, None]
                parent = np.where(swap, r.parent.numpy(), parent)
                token = np.where(swap, r.token.numpy(), token)
                top = np.where(swap, r.score.numpy(), top)
                child = np.where(swap, n + r.child.numpy(), child)
                in_tree |= swap
                go_on |= swap[:, 0]
            if self.bounded:
                go_on |= in_tree.any(-1)  # the next step checks the others are out of reach
            go_on &= active & ~done
            take = in_tree & go_on[:, None]
            parent_last = last[sources, parent]
            replay.add(parent, token, top, parent_last, active)
            accepted += take.sum(-1)
            last = np.where(take, child, parent_last)
            row = np.where(take, child, -1)
            scores = top
            active = go_on
            if not active.any():
                break
        seqs, step_scores, origin = replay.prefixes()
        steps, (_, roots, scores, parent_last) = replay.final()
        state.seqs, state.step_scores = seqs, step_scores
        state.scores = torch.from_numpy(scores)
        state.step_nr = state.step_nr + torch.from_numpy(steps)
        state.n = k
        return Acceptance(
            origin=torch.from_numpy(origin),
            node=torch.from_numpy(np.maximum(parent_last - n, -1)),
            roots=torch.from_numpy(roots),
            steps=torch.from_numpy(steps),
            accepted=torch.from_numpy(accepted),
            done=torch.from_numpy(done),
        )

    def _finish(
        self,
        finishing: np.ndarray,
        parent: np.ndarray,
        top: np.ndarray,
        seqs: Tensor,
        step_scores: Tensor,
        step_nr: Tensor,
        source_ids: Tensor,
        output: list[list[Hypothesis]],
        done: np.ndarray,
    ) -> None:
        """Moves the EOS candidates in the top k to the output, in rank order, until a
        source has k hypotheses (then it is done, as in fairseq2)."""
        for s, rank in zip(*finishing.nonzero(), strict=True):
            if done[s]:
                continue
            hyp, t, score = int(parent[s, rank]), int(step_nr[s]), torch.tensor(top[s, rank])
            hyps = output[int(source_ids[s])]
            hyps.append(self.finish(seqs[s, hyp], step_scores[s, hyp], score, t))
            if len(hyps) == self.k:
                done[s] = True


def _id(token: int | None) -> int:
    return -1 if token is None else token


def _ranked(
    cand: Tensor, k: int, vocab: int, eos: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """fairseq2's ranking of one step's candidates cand (S, h·V): the top 2k scores and
    their flat indices, tokens and EOS flags, and `keep` (S, k), the ranks of the first k
    non-EOS ones."""
    top, index = (t.numpy() for t in cand.topk(min(2 * k, cand.size(1))))
    token = index % vocab
    is_eos = token == eos
    return top, index, token, is_eos, np.argsort(is_eos, axis=1, kind="stable")[:, :k]


def _node_keys(tree: DraftTree, n: int, vocab: int) -> np.ndarray:
    """(S, n + D * w): each tree node's parent row times `vocab` plus its token, so that a
    candidate (parent row, token) finds its node by one comparison; -1 for the live
    hypotheses' rows and invalid nodes."""
    tokens, parents, valid = tree.tokens.numpy(), tree.parents.numpy(), tree.valid.numpy()
    num_sources, depth, width = tokens.shape
    # The parent's row: a live hypothesis at depth 1, else a node one level up.
    offset = np.array([0] + [n + (d - 1) * width for d in range(1, depth)], dtype=np.int64)
    keys = np.where(valid, (parents + offset[:, None]) * vocab + tokens, -1)
    return np.concatenate([np.full((num_sources, n), -1), keys.reshape(num_sources, -1)], 1)


@final
class _Replay:
    """The replay's steps, kept as (parent, token, score) per step: the hypotheses'
    tokens and scores are rebuilt once at the end (or when a finishing hypothesis or a
    step processor needs its prefix), not copied at every step."""

    def __init__(self, state: BeamState) -> None:
        self.state = state
        # Per step, each (S, k): parent, token, cumulative score, the parent's deepest
        # verified row; and (S,) whether the source took the step.
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.taken: list[np.ndarray] = []

    def add(
        self,
        parent: np.ndarray,
        token: np.ndarray,
        score: np.ndarray,
        parent_last: np.ndarray,
        taken: np.ndarray,
    ) -> None:
        self.steps.append((parent, token, score, parent_last))
        self.taken.append(taken)

    def final(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """Steps each source took (S,), and its last step's record (each (S, k))."""
        steps = np.stack(self.taken, 1).sum(1)
        sources = np.arange(len(steps))
        return steps, [np.stack(f, 1)[sources, steps - 1] for f in zip(*self.steps, strict=True)]

    def prefixes(self) -> tuple[Tensor, Tensor, np.ndarray]:
        """Tokens and cumulative scores (S, h, L) of the current hypotheses (each source's
        after its last step taken) and the live hypothesis each extends (S, h)."""
        state = self.state
        num_sources, n = state.scores.shape
        if not self.steps:
            return state.seqs[:, :n], state.step_scores[:, :n], np.tile(np.arange(n), (num_sources, 1))  # fmt: skip
        taken = np.stack(self.taken, 1)  # (S, J): a prefix of each row is True
        h = self.steps[-1][0].shape[1]
        sources = np.arange(num_sources)[:, None]
        hyp = np.tile(np.arange(h), (num_sources, 1))
        tokens, scores = [], []
        for j in range(len(self.steps) - 1, -1, -1):
            parent, token, score, _ = self.steps[j]
            tokens.append(token[sources, hyp])
            scores.append(score[sources, hyp])
            hyp = np.where(taken[:, j, None], parent[sources, hyp], hyp)
        # A step a source did not take repeats its last one: same value at the same index.
        last = np.maximum(taken.sum(1, keepdims=True) - 1, 0)
        step = np.minimum(np.arange(taken.shape[1]), last)[:, None]  # (S, 1, J)
        length = state.seqs.size(-1)
        at = np.minimum(state.step_nr.numpy()[:, None, None] + step, length - 1)
        at = torch.from_numpy(at).expand(-1, h, -1)
        rows = torch.from_numpy(hyp)[..., None].expand(-1, -1, length)
        seqs, step_scores = state.seqs.gather(1, rows), state.step_scores.gather(1, rows)
        # (S, h, J): step J - 1 - i was appended i-th.
        at_step = (sources[..., None], np.arange(h)[:, None], len(self.steps) - 1 - step)
        seqs.scatter_(2, at, torch.from_numpy(np.stack(tokens, 2)[at_step]))
        step_scores.scatter_(2, at, torch.from_numpy(np.stack(scores, 2)[at_step]))
        return seqs, step_scores, hyp


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
    steps_ahead = torch.arange(depth + 1, device=seqs.device)  # (D + 1,)
    at = (state.step_nr[:, None] + steps_ahead).clamp(max=seqs.size(1) - 1)
    write = steps_ahead <= last
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
        origin=torch.zeros_like(last),
        node=last - 1,
        roots=choice.gather(1, last),
        steps=steps,
        accepted=accepted,
        done=finished,
    )
