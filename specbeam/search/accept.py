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
runs where the logits are; the bookkeeping on (S, k)-sized tensors runs on the host, and
every crossing goes through `to_host` and `to_device`, the host/device boundary. On a
CPU they copy nothing. On a GPU a pass's small inputs cross once at its start and its
results once at its end; in between, each step sends the rows it reads and gets back its
2k best candidates per source, since the ranking runs on the device, where ties break as
in fairseq2's search there. Each step keeps its parents, tokens and scores; the
hypotheses' tokens and scores are written once, at the end (`_Replay`). Beam 1 over a
linear draft (spec greedy) ranks all steps of a pass in one batch instead.

Where the native extension is built (`specbeam.kernels.native`) and no step processors
take part, all of it, a relaxation included, runs compiled (csrc/accept.cpp), scoring only
the slots the replay reads: a pass's acceptance then costs less than half of the torch
replay's (docs/bench.md). The Python loops remain for the rest, and the tests hold both to
the same output.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import final

import torch
from fairseq2.generation import Hypothesis
from torch import Tensor

from specbeam.kernels import native
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
        processed = bool(self.rules.step_processors)
        ext = None if processed else native.module_for(verification.logits)
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
        relax = self.relax or Relaxation(top=0)
        finished = torch.tensor([len(output[i]) for i in state.source_ids.tolist()], device=HOST)
        seqs, step_scores, scores, origin, node, roots, steps, accepted, done, *events = ext.accept(
            verification.logits, verification.root_slots, verification.node_slots, tree.tokens,
            tree.parents, tree.valid, verification.table.positions[:, :num_slots], state.scores,
            state.seqs, state.step_scores, state.step_nr, finished, self.k,
            [rules.eos_idx, _id(rules.pad_idx), _id(rules.unk_idx), rules.min_seq_len, rules.max_seq_len, relax.top],
            [rules.unk_penalty, rules.temperature, relax.gap], self.bounded,
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
        k, n, device = self.k, state.n, state.seqs.device
        lprobs = _scored(self.rules, verification)  # (S, n, V): slot i is hypothesis i
        num_sources, _, vocab = lprobs.shape
        cand = (state.scores[..., None] + lprobs).flatten(1)
        top, index, token, is_eos, keep = _ranked(cand, k, vocab, self.rules.eos_idx)
        done = torch.zeros(num_sources, dtype=torch.bool, device=HOST)
        finishing = is_eos[:, :k]
        if finishing.any():
            step_nr, source_ids = to_host(state.step_nr, state.source_ids)
            seqs, step_scores = state.seqs[:, :n], state.step_scores[:, :n]
            self._finish(finishing, index // vocab, top, seqs, step_scores, step_nr, source_ids, output, done)  # fmt: skip
        parent, token, top, done = to_device(
            device, index.gather(1, keep) // vocab, token.gather(1, keep), top.gather(1, keep), done
        )
        length = state.seqs.size(-1)
        rows = parent[..., None].expand(-1, -1, length)
        state.seqs, state.step_scores = (
            state.seqs.gather(1, rows),
            state.step_scores.gather(1, rows),
        )
        at = state.step_nr.clamp(max=length - 1)[:, None, None].expand(-1, k, 1)
        state.seqs.scatter_(2, at, token[..., None])
        state.scores = top
        state.step_scores.scatter_(2, at, state.scores[..., None])
        state.step_nr = state.step_nr + 1
        state.n = k
        ones = torch.ones(num_sources, dtype=torch.int64, device=device)
        return Acceptance(
            origin=parent,
            node=torch.full_like(parent, -1),
            roots=token,
            steps=ones,
            accepted=torch.zeros_like(ones),
            done=done,
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
        device = verification.logits.device
        every_slot = None if self.rules.step_processors else _scored(self.rules, verification)
        # Row r of the replay: live hypothesis r < n, else tree node r - n; its slot, as
        # an index into the flattened (S * T, V) log-probs.
        slots = torch.cat([verification.root_slots, verification.node_slots.flatten(1)], 1)
        slots, tokens, parents, valid, scores, step_nr, source_ids = to_host(
            slots, tree.tokens, tree.parents, tree.valid, state.scores, state.step_nr,
            state.source_ids,
        )  # fmt: skip
        flat_slots = slots + torch.arange(num_sources, device=HOST)[:, None] * num_slots  # (S, R)
        keys = _node_keys(tokens, parents, valid, n, vocab)[:, None, :]  # (S, 1, R)
        replay = _Replay(state, step_nr)
        row = torch.arange(n, device=HOST).expand(num_sources, n)  # (S, h) -1: off the tree
        last = row  # the deepest verified row on each hypothesis' path
        active = torch.ones(num_sources, dtype=torch.bool, device=HOST)
        done = torch.zeros(num_sources, dtype=torch.bool, device=HOST)
        accepted = torch.zeros(num_sources, dtype=torch.int64, device=HOST)
        for j in range(tree.depth + 1):
            off = row < 0 if j > 0 else None  # the first step's rows are the live hypotheses
            some_off = off is not None and bool(off.any())
            bases = scores.masked_fill(off, -torch.inf) if some_off else scores
            # row -1 reads some row: masked by its base.
            at_slot, bases = to_device(device, flat_slots.gather(1, row.clamp(min=0)), bases)
            if every_slot is None:
                logits = verification.logits.flatten(0, 1).index_select(0, at_slot.flatten())
                lprobs = self.rules.log_probs(logits).view(num_sources, -1, vocab)
                self.rules.apply(lprobs, state.step_nr + j, replay.prefixes()[0])
            else:
                lprobs = every_slot.flatten(0, 1).index_select(0, at_slot.flatten())
                lprobs = lprobs.view(num_sources, -1, vocab)  # (S, h, V)
            cand = (bases[..., None] + lprobs).flatten(1)
            top, index, token, is_eos, keep = _ranked(cand, k, vocab, self.rules.eos_idx)
            if some_off:
                assert off is not None
                # A hypothesis off the tree has no verified log-probs, but its children
                # score at most its own score. The step is decided by the candidates up to
                # the k-th non-EOS one: below it, none of those children could change it.
                decisive = top.gather(1, keep[:, -1:])[:, 0]
                reach = scores.masked_fill(~off, -torch.inf).amax(-1)
                active &= ~off.any(-1) | (reach < decisive)  # else the pass ends before j
            # EOS in the top k is rare: the mask is built only then.
            some_finish = bool(is_eos[:, :k].any())
            if some_finish:
                finishing = is_eos[:, :k] & active[:, None]
                seqs, step_scores, _ = replay.prefixes()
                self._finish(finishing, index // vocab, top, seqs, step_scores, step_nr + j, source_ids, output, done)  # fmt: skip
            index, token, top = index.gather(1, keep), token.gather(1, keep), top.gather(1, keep)
            parent = index // vocab
            # A node's key is its parent's row and its token; an off-tree parent has none.
            key = row.gather(1, parent) * vocab + token
            # child: the first matching row (any row where none matches)
            in_tree, child = (key[..., None] == keys).max(-1)  # (S, k, R) -> (S, k)
            if self.relax is not None and j < tree.depth and width >= k:
                level = row if j == 0 else row - n - (j - 1) * width  # ids in level j's parents
                on_device = to_device(device, scores, level)
                r = relaxed_step(self.relax, lprobs, *on_device, tree, j, k)
                ok, r_parent, r_token, r_score, r_child = to_host(
                    r.ok, r.parent, r.token, r.score, r.child
                )
                swap = (ok & ~in_tree.all(-1))[:, None]
                parent = torch.where(swap, r_parent, parent)
                token = torch.where(swap, r_token, token)
                top = torch.where(swap, r_score, top)
                child = torch.where(swap, n + r_child, child)
                in_tree |= swap
            # Bounded, the next step checks the hypotheses off the tree are out of reach.
            go_on = in_tree.any(-1) if self.bounded else in_tree.all(-1)
            # A source done in an earlier step is no longer active.
            go_on &= (active & ~done) if some_finish else active
            take = in_tree & go_on[:, None]
            parent_last = last.gather(1, parent)
            replay.add(parent, token, top, parent_last, active)
            accepted += take.sum(-1)
            last = torch.where(take, child, parent_last)
            row = torch.where(take, child, -1)
            scores = top
            active = go_on
            if not active.any():
                break
        seqs, step_scores, origin = replay.prefixes()
        steps, (roots, scores, parent_last) = replay.final()
        origin, node, roots, steps, accepted, done, scores = to_device(
            device, origin, (parent_last - n).clamp(min=-1), roots, steps, accepted, done, scores
        )
        state.seqs, state.step_scores = seqs, step_scores
        state.scores = scores
        state.step_nr = state.step_nr + steps
        state.n = k
        return Acceptance(origin, node, roots, steps, accepted, done)

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
        source has k hypotheses (then it is done, as in fairseq2). finishing, parent, top:
        (S, ·) and step_nr, source_ids, done: (S,) on the host; seqs, step_scores (S, h, L)
        where the state lives."""
        for s, rank in finishing.nonzero().tolist():
            if done[s]:
                continue
            hyp, t = int(parent[s, rank]), int(step_nr[s])
            (score,) = to_device(seqs.device, top[s, rank].clone())
            hyps = output[int(source_ids[s])]
            hyps.append(self.finish(seqs[s, hyp], step_scores[s, hyp], score, t))
            if len(hyps) == self.k:
                done[s] = True


HOST = torch.device("cpu")
"""Where the replay's bookkeeping runs."""


def to_host(*tensors: Tensor) -> list[Tensor]:
    """THE host/device boundary, inward: the replay's bookkeeping runs on the host, over
    the small tensors ((S, k) to (S, R)) it reads. On a CPU these are the tensors
    themselves; on a GPU each call is a copy and a wait."""
    return [t.to(HOST) for t in tensors]


def to_device(device: torch.device, *tensors: Tensor) -> list[Tensor]:
    """THE host/device boundary, outward: what the replay decided, to where the
    state, the log-probs and the caches live."""
    return [t.to(device) for t in tensors]


def _id(token: int | None) -> int:
    return -1 if token is None else token


def _ranked(
    cand: Tensor, k: int, vocab: int, eos: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """fairseq2's ranking of one step's candidates cand (S, h·V), where they are (ties
    break as in fairseq2's search there): on the host, the top 2k scores and their flat
    indices, tokens and EOS flags, and `keep` (S, k), the ranks of the first k non-EOS
    ones."""
    top, index = to_host(*cand.topk(min(2 * k, cand.size(1))))
    token = index % vocab
    is_eos = token == eos
    return top, index, token, is_eos, is_eos.argsort(dim=1, stable=True)[:, :k]


def _node_keys(tokens: Tensor, parents: Tensor, valid: Tensor, n: int, vocab: int) -> Tensor:
    """(S, n + D * w): each tree node's parent row times `vocab` plus its token, so that a
    candidate (parent row, token) finds its node by one comparison; -1 for the live
    hypotheses' rows and invalid nodes. tokens, parents, valid: the tree's (S, D, w)."""
    num_sources, depth, width = tokens.shape
    # The parent's row: a live hypothesis at depth 1, else a node one level up.
    offset = torch.tensor([0] + [n + (d - 1) * width for d in range(1, depth)], device=HOST)
    keys = torch.where(valid, (parents + offset[:, None]) * vocab + tokens, -1)
    return torch.cat([keys.new_full((num_sources, n), -1), keys.flatten(1)], 1)


@final
class _Replay:
    """The replay's steps, kept on the host as (parent, token, score) per step: the
    hypotheses' tokens and scores are rebuilt once at the end (or when a finishing
    hypothesis or a step processor needs its prefix), not copied at every step."""

    def __init__(self, state: BeamState, step_nr: Tensor) -> None:
        """step_nr: the state's (S,), on the host."""
        self.state = state
        self.step_nr = step_nr
        # Per step, each (S, k): parent, token, cumulative score, the parent's deepest
        # verified row; and (S,) whether the source took the step.
        self.steps: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.taken: list[Tensor] = []

    def add(
        self, parent: Tensor, token: Tensor, score: Tensor, parent_last: Tensor, taken: Tensor
    ) -> None:
        self.steps.append((parent, token, score, parent_last))
        self.taken.append(taken)

    def final(self) -> tuple[Tensor, list[Tensor]]:
        """Steps each source took (S,), and its last step's token, score and parent's
        deepest verified row (each (S, k))."""
        steps = torch.stack(self.taken, 1).sum(1)
        _, *fields = zip(*self.steps, strict=True)
        at = (steps - 1)[:, None, None].expand(-1, 1, self.steps[-1][0].size(1))  # (S, 1, k)
        return steps, [torch.stack(f, 1).gather(1, at)[:, 0] for f in fields]

    def prefixes(self) -> tuple[Tensor, Tensor, Tensor]:
        """Tokens and cumulative scores (S, h, L) of the current hypotheses (each source's
        after its last step taken), where the state lives, and the live hypothesis each
        extends (S, h), on the host."""
        state = self.state
        num_sources, n = state.scores.shape
        if not self.steps:
            return state.seqs[:, :n], state.step_scores[:, :n], torch.arange(n, device=HOST).expand(num_sources, n)  # fmt: skip
        taken = torch.stack(self.taken, 1)  # (S, J): a prefix of each row is True
        num_steps, h = taken.size(1), self.steps[-1][0].size(1)
        hyp = torch.arange(h, device=HOST).expand(num_sources, h)
        tokens, scores = [], []
        for j in range(num_steps - 1, -1, -1):
            parent, token, score, _ = self.steps[j]
            tokens.append(token.gather(1, hyp))
            scores.append(score.gather(1, hyp))
            hyp = torch.where(taken[:, j, None], parent.gather(1, hyp), hyp)
        # A step a source did not take repeats its last one: same value at the same index.
        last = (taken.sum(1, keepdim=True) - 1).clamp(min=0)
        step = torch.minimum(torch.arange(num_steps, device=HOST), last)  # (S, J)
        length = state.seqs.size(-1)
        at = (self.step_nr[:, None] + step).clamp(max=length - 1)[:, None].expand(-1, h, -1)
        # (S, h, J): step J - 1 - i was appended i-th.
        appended = (num_steps - 1 - step)[:, None].expand(-1, h, -1)
        new_tokens = torch.stack(tokens, 2).gather(2, appended)
        new_scores = torch.stack(scores, 2).gather(2, appended)
        rows, at, new_tokens, new_scores = to_device(
            state.seqs.device, hyp[..., None].expand(-1, -1, length), at, new_tokens, new_scores
        )
        seqs, step_scores = state.seqs.gather(1, rows), state.step_scores.gather(1, rows)
        seqs.scatter_(2, at, new_tokens)
        step_scores.scatter_(2, at, new_scores)
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
