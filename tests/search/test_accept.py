"""Exact acceptance on a hand-made verification: when a pass may go on past a hypothesis
the draft missed."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from fairseq2.generation.step_processor import StepProcessor

from specbeam.kernels import native
from specbeam.search.accept import BeamAcceptor
from specbeam.search.beam import BeamState, HypothesisFactory
from specbeam.search.relax import Relaxation
from specbeam.search.rules import ScoringRules
from specbeam.search.slots import SlotTable
from specbeam.search.tree import DraftTree
from specbeam.search.verify import Verification

PAD, EOS, VOCAB, K = 0, 1, 8, 2


@pytest.fixture(params=[True, False], ids=["compiled", "python"])
def compiled(request, use_runtime):
    """Acceptance through csrc/accept.cpp, or through its Python loops."""
    assert native.build() is not None  # else both would be the Python loops
    use_runtime(native=request.param)
    return request.param


def _logits(probs: dict[int, float]) -> torch.Tensor:
    """Log-probs with the given tokens' probabilities, the rest spread evenly."""
    rest = (1.0 - sum(probs.values())) / (VOCAB - len(probs))
    return torch.tensor([math.log(probs.get(t, rest)) for t in range(VOCAB)])


def _accept(second_score: float) -> tuple:
    """Beam 2 at step 3 with hypotheses scored 0 and `second_score`; the draft tree has
    one level, both nodes below hypothesis 0 (tokens 3 and 5). Step 0 keeps 0·3 (a node)
    and 1·4 (off the tree); step 1 ranks 0·3·6, then EOS, then 0·3·7."""
    rules = ScoringRules(EOS, PAD, None, 0.0, 1.0, min_seq_len=1, max_seq_len=20)
    finish = HypothesisFactory(EOS, 1, echo_prompt=False, normalize_scores=True, len_penalty=1.0)
    state = BeamState.start(torch.tensor([[EOS, 2, 2]]), K, 20)
    state.scores, state.n = torch.tensor([[0.0, second_score]]), K
    logits = torch.stack(
        [
            _logits({3: 0.9}),  # after hypothesis 0
            _logits({4: 0.6}),  # after hypothesis 1
            _logits({6: 0.55, EOS: 0.3, 7: 0.1}),  # after node 0·3
            _logits({}),  # after node 0·5
        ]
    )[None]
    verification = Verification(
        SlotTable(1, 4, torch.device("cpu")),
        chain_slots=torch.tensor([[[0], [1]]]),
        node_slots=torch.tensor([[[2, 3]]]),
        features=torch.zeros((1, 4, 1)),
        logits=logits,
        computed_slots=4,
    )
    tree = DraftTree(
        tokens=torch.tensor([[[3, 5]]]),
        parents=torch.zeros((1, 1, 2), dtype=torch.int64),
        valid=torch.ones((1, 1, 2), dtype=torch.bool),
        scores=torch.zeros((1, 1, 2)),
    )
    output: list[list] = [[]]
    acceptance = BeamAcceptor(rules, K, finish).accept(state, verification, tree, output)
    return acceptance, state, output


def test_an_off_tree_hypothesis_below_the_kth_non_eos_candidate_does_not_stop_the_pass(
    compiled,
) -> None:
    """Hypothesis 1·4 scores ln 0.6 - 2.0 = -2.51: below 0·3·7 (ln 0.9 + ln 0.1 = -2.41),
    the 2nd non-EOS candidate, so none of its children can enter step 1's beam, though
    they could outrank its 4th candidate (the 2k-th, -4.7)."""
    acceptance, state, output = _accept(-2.0)
    assert acceptance.steps.tolist() == [2]
    assert state.seqs[0, :, 3:5].tolist() == [[3, 6], [3, 7]]
    expected = [math.log(0.9) + math.log(0.55), math.log(0.9) + math.log(0.1)]
    assert state.scores[0].tolist() == pytest.approx(expected, abs=1e-5)
    (finished,) = output[0]  # the EOS ranked 2nd, within the top k
    assert finished.seq.tolist() == [2, 2, 3, EOS]
    assert float(finished.score) == pytest.approx((math.log(0.9) + math.log(0.3)) / 4, abs=1e-5)


def test_an_off_tree_hypothesis_that_could_reach_the_beam_stops_the_pass(compiled) -> None:
    """At -1.51, a child of 1·4 could rank before 0·3·7: the pass ends after step 0."""
    acceptance, state, output = _accept(-1.0)
    assert acceptance.steps.tolist() == [1]
    assert state.seqs[0, :, 3].tolist() == [3, 4]
    assert output == [[]]


class _NoOp(StepProcessor):
    """Sends acceptance down the step-by-step loop without changing a log-prob."""

    def __call__(self, seqs: torch.Tensor, probs: torch.Tensor, lprob: bool = False) -> None:
        pass


def _chain_case(seed: int) -> tuple:
    """Beam 1 over a random drafted chain: logits that often agree with the draft, EOS
    often likely, sources near the length limits, sometimes an UNK bonus or penalty."""
    gen = torch.Generator().manual_seed(seed)
    num_sources, depth, vocab = 4, int(torch.randint(0, 5, (1,), generator=gen)), 6
    max_seq_len = 12
    drafted = torch.randint(0, vocab, (num_sources, depth), generator=gen)
    logits = torch.randn((num_sources, 1 + depth, vocab), generator=gen)
    agree = torch.rand((num_sources, depth), generator=gen) < 0.85
    logits[:, :depth].scatter_add_(2, drafted[..., None], 4.0 * agree[..., None].float())
    logits[..., EOS] += 2.0 * (torch.rand((num_sources, 1 + depth), generator=gen) < 0.2)
    state = BeamState.start(torch.tensor([[EOS, 2]] * num_sources), 1, max_seq_len)
    state.step_nr = torch.randint(2, max_seq_len, (num_sources,), generator=gen)
    state.scores = -torch.rand((num_sources, 1), generator=gen) * 5
    state.seqs[:, 0, 2:] = torch.randint(2, vocab, (num_sources, max_seq_len - 2), generator=gen)
    state.step_scores[:, 0] = -torch.rand((num_sources, max_seq_len), generator=gen)
    table = SlotTable(num_sources, 1 + depth, torch.device("cpu"))
    table.positions[:] = state.step_nr[:, None] - 1 + torch.arange(1 + depth)  # root first
    verification = Verification(
        table,
        chain_slots=torch.zeros((num_sources, 1, 1), dtype=torch.int64),
        node_slots=torch.arange(1, depth + 1).expand(num_sources, depth)[..., None],
        features=torch.zeros((num_sources, 1 + depth, 1)),
        logits=logits,
        computed_slots=num_sources * (1 + depth),
    )
    tree = DraftTree(
        tokens=drafted[..., None],
        parents=torch.zeros((num_sources, depth, 1), dtype=torch.int64),
        valid=torch.rand((num_sources, depth, 1), generator=gen) < 0.9,
        scores=torch.zeros((num_sources, depth, 1)),
    )
    unk = [None, 3][seed % 2]
    penalty = [0.0, -1.0, 2.0][seed % 3]
    return state, verification, tree, unk, penalty, max_seq_len


def _widened(verification: Verification, tree: DraftTree) -> tuple[Verification, DraftTree]:
    """The same chain in a tree of width 2 whose second column is empty: the step loop."""

    def pad(t: torch.Tensor, value: float | bool) -> torch.Tensor:
        return torch.cat([t, torch.full_like(t, value)], dim=-1)

    tree = DraftTree(
        pad(tree.tokens, 0), pad(tree.parents, 0), pad(tree.valid, False), pad(tree.scores, 0)
    )
    verification = copy.copy(verification)
    verification.node_slots = pad(verification.node_slots, 0)
    return verification, tree


@pytest.mark.parametrize("seed", range(60))
def test_beam_one_over_a_chain_ranks_every_step_as_the_step_loop_does(seed: int, compiled) -> None:
    """Three ways to the same steps: the chain's batched ranking, the step loop on
    log-probs scored for every slot at once, and the step loop scoring each step (a
    step processor that changes nothing forces it)."""
    state, verification, tree, unk, penalty, max_seq_len = _chain_case(seed)
    finish = HypothesisFactory(EOS, 2, echo_prompt=False, normalize_scores=True, len_penalty=1.0)
    results = []
    for processors, wide in [((), False), ((), True), ((_NoOp(),), False)]:
        rules = ScoringRules(EOS, PAD, unk, penalty, 1.0, 4, max_seq_len, processors)
        v, t = _widened(verification, tree) if wide else (verification, tree)
        s = copy.deepcopy(state)
        output: list[list] = [[] for _ in range(len(s.step_nr))]
        acceptance = BeamAcceptor(rules, 1, finish).accept(s, v, t, output)
        acceptance.node = torch.where(acceptance.node < 0, -1, acceptance.node // t.width)
        results.append((acceptance, s, output))
    (loop, loop_state, loop_out) = results[-1]
    live = ~loop.done
    for fast, fast_state, fast_out in results[:-1]:
        for field in ["steps", "accepted", "done"]:
            assert getattr(fast, field).tolist() == getattr(loop, field).tolist(), field
        for field in ["origin", "node", "roots"]:
            assert getattr(fast, field)[live].tolist() == getattr(loop, field)[live].tolist()
        assert torch.equal(fast_state.step_nr, loop_state.step_nr)
        assert torch.equal(fast_state.scores[live], loop_state.scores[live])
        for row in live.nonzero().squeeze(1).tolist():
            end = int(loop_state.step_nr[row])
            assert fast_state.seqs[row, 0, :end].tolist() == loop_state.seqs[row, 0, :end].tolist()
            assert torch.equal(
                fast_state.step_scores[row, 0, :end], loop_state.step_scores[row, 0, :end]
            )
        for want, got in zip(loop_out, fast_out, strict=True):
            assert [h.seq.tolist() for h in got] == [h.seq.tolist() for h in want]
            assert [float(h.score) for h in got] == [float(h.score) for h in want]
            for g, w in zip(got, want, strict=True):
                assert torch.equal(g.step_scores, w.step_scores)


def _roots_case(seed: int) -> tuple:
    """Plain beam 3 (no tree): one slot per live hypothesis, EOS often in the top k,
    sources near the length limits, sometimes at the first step (one hypothesis)."""
    gen = torch.Generator().manual_seed(seed)
    num_sources, k, vocab, max_seq_len = 4, 3, 7, 12
    n = 1 if seed % 4 == 0 else k
    state = BeamState.start(torch.tensor([[EOS, 2]] * num_sources), k, max_seq_len)
    state.n = n
    state.step_nr = torch.randint(2, max_seq_len, (num_sources,), generator=gen)
    state.scores = -torch.rand((num_sources, n), generator=gen) * 5
    state.seqs[:, :, 2:] = torch.randint(2, vocab, (num_sources, k, max_seq_len - 2), generator=gen)
    state.step_scores[:] = -torch.rand((num_sources, k, max_seq_len), generator=gen)
    logits = torch.randn((num_sources, n, vocab), generator=gen)
    logits[..., EOS] += 2.0 * (torch.rand((num_sources, n), generator=gen) < 0.3)
    table = SlotTable(num_sources, n, torch.device("cpu"))
    table.positions[:] = state.step_nr[:, None] - 1
    verification = Verification(
        table,
        chain_slots=torch.arange(n).expand(num_sources, n)[..., None],
        node_slots=torch.zeros((num_sources, 0, 1), dtype=torch.int64),
        features=torch.zeros((num_sources, n, 1)),
        logits=logits,
        computed_slots=num_sources * n,
    )
    return state, verification, max_seq_len


@pytest.mark.parametrize("seed", range(40))
def test_a_plain_step_is_the_replays_first_step(seed: int, compiled) -> None:
    """Without a tree, acceptance takes fairseq2's step once (`_accept_roots`): the same
    hypotheses, scores, finished hypotheses and cache origins as the replay, and as the
    replay scoring the step itself (a step processor that changes nothing forces it)."""
    state, verification, max_seq_len = _roots_case(seed)
    finish = HypothesisFactory(EOS, 2, echo_prompt=False, normalize_scores=True, len_penalty=1.0)
    tree = DraftTree.empty(len(state.step_nr), state.step_nr.device)
    results = []
    for processors, how in [((), "roots"), ((), "tree"), ((_NoOp(),), "tree")]:
        rules = ScoringRules(EOS, PAD, 3, [0.0, 1.5][seed % 2], 1.0, 4, max_seq_len, processors)
        acceptor, s = BeamAcceptor(rules, 3, finish), copy.deepcopy(state)
        output: list[list] = [[] for _ in range(len(s.step_nr))]
        if how == "roots":
            acceptance = acceptor.accept(s, verification, tree, output)
        else:
            acceptance = acceptor._accept_tree(s, verification, tree, output)
        results.append((acceptance, s, output))
    want, want_state, want_out = results[-1]
    for got, got_state, got_out in results[:-1]:
        for field in ["origin", "node", "roots", "steps", "accepted", "done"]:
            assert torch.equal(getattr(got, field), getattr(want, field)), field
        for field in ["seqs", "step_scores", "scores", "step_nr"]:
            assert torch.equal(getattr(got_state, field), getattr(want_state, field)), field
        assert got_state.n == want_state.n == 3
        for w, g in zip(want_out, got_out, strict=True):
            assert [h.seq.tolist() for h in g] == [h.seq.tolist() for h in w]
            assert [float(h.score) for h in g] == [float(h.score) for h in w]


def _tree_case(seed: int) -> tuple:
    """Beam 3 over a random draft tree (depth 1-3, width 4): logits that often agree with
    the drafted tokens, EOS often likely, sources near the length limits, some with
    finished hypotheses already, some at their first step (one hypothesis)."""
    gen = torch.Generator().manual_seed(seed)
    num_sources, k, width, vocab, max_seq_len = 4, 3, 4, 9, 14
    depth = 1 + seed % 3
    n = 1 if seed % 5 == 0 else k
    state = BeamState.start(torch.tensor([[EOS, 2]] * num_sources), k, max_seq_len)
    state.n = n
    state.step_nr = torch.randint(2, max_seq_len - 1, (num_sources,), generator=gen)
    state.scores = -torch.rand((num_sources, n), generator=gen) * 3
    state.seqs[:, :, 2:] = torch.randint(2, vocab, (num_sources, k, max_seq_len - 2), generator=gen)
    state.step_scores[:] = -torch.rand((num_sources, k, max_seq_len), generator=gen)
    tokens = torch.randint(2, vocab, (num_sources, depth, width), generator=gen)
    parents = torch.randint(0, n, (num_sources, depth, width), generator=gen)
    parents[:, 1:] = torch.randint(0, width, (num_sources, depth - 1, width), generator=gen)
    valid = torch.rand((num_sources, depth, width), generator=gen) < 0.85
    for d in range(1, depth):
        valid[:, d] &= valid[:, d - 1].gather(1, parents[:, d])
    num_slots = n + depth * width
    logits = torch.randn((num_sources, num_slots, vocab), generator=gen)
    # Raise each node's token in its parent's slot, so that the beam often stays in the tree.
    parent_slot = torch.cat([parents[:, :1], n + (torch.arange(depth - 1)[:, None] * width + parents[:, 1:])], 1)  # fmt: skip
    boost = 3.0 * (valid & (torch.rand(valid.shape, generator=gen) < 0.8))
    logits.view(num_sources, -1).scatter_add_(
        1, (parent_slot * vocab + tokens).flatten(1), boost.flatten(1)
    )
    logits[..., EOS] += 2.5 * (torch.rand((num_sources, num_slots), generator=gen) < 0.3)
    table = SlotTable(num_sources, num_slots, torch.device("cpu"))
    table.positions[:] = state.step_nr[:, None] - 1
    table.positions[:, n:] += 1 + torch.arange(depth).repeat_interleave(width)
    verification = Verification(
        table,
        chain_slots=torch.arange(n).expand(num_sources, n)[..., None],
        node_slots=(n + torch.arange(depth * width)).view(depth, width).expand(num_sources, -1, -1),
        features=torch.zeros((num_sources, num_slots, 1)),
        logits=logits,
        computed_slots=num_sources * num_slots,
    )
    tree = DraftTree(tokens, parents, valid, torch.zeros(valid.shape))
    finished = torch.randint(0, k, (num_sources,), generator=gen).tolist()
    return state, verification, tree, finished, max_seq_len


@pytest.mark.parametrize(
    "relax",
    [None, Relaxation(top=2, gap=1.0), Relaxation(top=4, gap=3.0), Relaxation(top=20, gap=9.0)],
    ids=["exact", "top2", "top4", "top20"],
)
@pytest.mark.parametrize("seed", range(60))
def test_the_compiled_replay_is_the_python_replay(
    seed: int, relax: Relaxation | None, use_runtime
) -> None:
    """`accept.cpp` against `_accept_tree`'s Python loop: the same hypotheses, scores,
    cache origins and finished hypotheses (in the same order), bounded or not (an UNK
    bonus lets children outscore their parent), exact or relaxed (relax.py; top 20 is
    beyond the vocabulary)."""
    assert native.build() is not None
    state, verification, tree, finished, max_seq_len = _tree_case(seed)
    finish = HypothesisFactory(EOS, 2, echo_prompt=False, normalize_scores=True, len_penalty=1.0)
    rules = ScoringRules(EOS, PAD, 3, [0.0, -1.0][seed % 2], 1.0, 4, max_seq_len)
    results = []
    for compiled in (False, True):
        use_runtime(native=compiled)
        s = copy.deepcopy(state)
        output: list[list] = [["earlier"] * f for f in finished]
        acceptance = BeamAcceptor(rules, 3, finish, relax).accept(s, verification, tree, output)
        results.append((acceptance, s, output))
    (want, want_state, want_out), (got, got_state, got_out) = results
    for field in ["origin", "node", "roots", "steps", "accepted", "done"]:
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    for field in ["seqs", "step_scores", "scores", "step_nr"]:
        assert torch.equal(getattr(got_state, field), getattr(want_state, field)), field
    for w, g in zip(want_out, got_out, strict=True):
        assert len(g) == len(w)
        for a, b in zip(w[len(w) - len(g) :], g, strict=True):
            if isinstance(a, str):
                assert b == a
                continue
            assert b.seq.tolist() == a.seq.tolist()
            assert float(b.score) == float(a.score)
            assert torch.equal(b.step_scores, a.step_scores)


def candidates_with_ties(gen: torch.Generator, case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """base (N, h) and log-probs (N, h, V) whose top candidates tie as `case` says."""
    h, vocab = 3, 40
    base = -torch.rand(4, h, generator=gen)
    lprobs = torch.log_softmax(torch.randn(4, h, vocab, generator=gen) * 3, -1)
    if case in ("within", "boundary"):
        base[:, :] = base[:, :1]  # so that equal log-probs are equal candidates
    best = (base[..., None] + lprobs).flatten(1).topk(7).indices
    rows, tokens = best // vocab, best % vocab
    n = torch.arange(4)
    if case == "within":  # the 2nd best equals the best
        lprobs[n, rows[:, 1], tokens[:, 1]] = lprobs[n, rows[:, 0], tokens[:, 0]]
    elif case == "boundary":  # the m-th and (m + 1)-th best are equal
        lprobs[n, rows[:, 6], tokens[:, 6]] = lprobs[n, rows[:, 5], tokens[:, 5]]
    elif case == "nan":
        lprobs[:, 1, 3] = math.nan
    elif case == "off_tree":  # hypotheses off the tree have no candidates
        base[:, 1:] = -math.inf
    elif case == "few_finite":  # a forced EOS: one finite candidate per row
        lprobs[:] = -math.inf
        lprobs[..., 2] = 0.0
    return base, lprobs


@pytest.mark.parametrize(
    "case", ["distinct", "within", "boundary", "nan", "off_tree", "few_finite"]
)
def test_the_scan_finds_topks_candidates_or_leaves_them_to_topk(case: str) -> None:
    """csrc/top.cpp: where the m + 1 best candidates are distinct, one scan gives topk's
    values and indices; where ties, NaN or too few finite ones leave the order to topk's
    own algorithm, it says so (acceptance then calls topk)."""
    ext = native.build()
    assert ext is not None
    gen = torch.Generator().manual_seed(11)
    for _ in range(20):
        base, lprobs = candidates_with_ties(gen, case)
        values, indices, found = ext.top_candidates(base, lprobs, 6)
        want = (base[..., None] + lprobs).flatten(1).topk(6)
        expected = case in ("distinct", "off_tree")
        assert torch.equal(found, torch.full((4,), expected)), case
        assert torch.equal(values[found], want.values[found])
        assert torch.equal(indices[found], want.indices[found])
