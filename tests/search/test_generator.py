"""Exactness: speculative beam search reproduces fairseq2's beam search on the same target.

Comparison rule: every n-best entry has identical tokens, and scores agree within
SCORE_TOL. The verification pass computes each node's log-probs in one tree-masked
block instead of one step at a time; in fp32 that changes scores by ≤ 1e-6, which
could only flip a choice on an exact tie. None of the seeded cases below hits one.
"""

from __future__ import annotations

import copy
import logging
import random
from dataclasses import dataclass

import pytest
import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.generation.step_processor import NGramRepeatBlockProcessor

from specbeam.data.batches import pad
from specbeam.integration.models import build_shallow_draft
from specbeam.kernels import lean_decoder
from specbeam.search.accept import BeamAcceptor
from specbeam.search.config import SearchSettings, SpeculativeSearchConfig
from specbeam.search.draft import Drafter
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead, HeadArch
from tests.conftest import DRAFT_ARCH, NLLB_PROMPT, PROMPT, sources

SCORE_TOL = 1e-5
"""A step's log-prob: fairseq2's modules and the lean decoder round fp32 products apart (other
kernels, other summation orders), so they agree within a few ulps, not bit for bit."""
SCORE_REL = 1e-6
"""A hypothesis' score sums its steps' log-probs, so their rounding differences add up with its
length: a 40-step score near -46 came out 1.5e-5 (4 ulps) apart on an AVX-512 CPU."""


@dataclass
class Case:
    seed: int
    batch: int
    beam_size: int
    gamma: int
    strategy: str
    draft_width: int | None
    max_draft_nodes: int | None
    len_penalty: float
    min_gen_len: int
    max_gen_len: tuple[float, int]
    prompt: torch.Tensor
    extra: dict
    shape: dict

    @staticmethod
    def draw(seed: int) -> Case:
        rng = random.Random(seed)
        beam = rng.randint(1, 8)
        strategy = rng.choice(["beam", "beam", "linear"])
        extra: dict = {}
        if rng.random() < 0.15:
            extra["unk_penalty"] = rng.choice([-1.0, 2.0])
        if rng.random() < 0.15:
            extra["temperature"] = rng.choice([0.7, 1.3])
        if rng.random() < 0.1:
            extra["normalize_scores"] = False
        if rng.random() < 0.1:
            extra["echo_prompt"] = True
        if rng.random() < 0.1:
            extra["step_processors"] = [NGramRepeatBlockProcessor(ngram_size=2)]
        case = Case(
            seed=seed,
            batch=rng.randint(1, 6),
            beam_size=beam,
            gamma=(gamma := rng.randint(1, 8)),
            strategy=strategy,
            draft_width=rng.choice([None, beam + rng.randint(1, 3)])
            if strategy == "beam"
            else None,
            max_draft_nodes=rng.choice([None, None, rng.randint(1, 12)]),  # raised to γ below
            len_penalty=rng.choice([1.0, 1.0, 0.6, 1.4]),
            min_gen_len=rng.choice([1, 1, 3, 8]),
            max_gen_len=rng.choice([(2.0, 5), (1.0, 3), (0.0, 9), (3.0, 10)]),
            prompt=rng.choice([PROMPT, NLLB_PROMPT]),
            extra=extra,
            shape=Case.draw_shape(rng, beam, gamma),
        )
        if case.max_draft_nodes is not None:
            case.max_draft_nodes = max(case.max_draft_nodes, case.gamma)
        return case

    @staticmethod
    def draw_shape(rng: random.Random, beam: int, gamma: int) -> dict:
        """Tree strategies beyond the draft's beam search, and pruning (drawn last, so the
        earlier draws of a seed stay what they were)."""
        shape: dict = {}
        if rng.random() < 0.3:
            shape["draft_strategy"] = "topm"
            shape["draft_branch"] = rng.randint(1, 3)
            shape["draft_branch_depth"] = rng.randint(0, 2)
            shape["draft_branch_below"] = rng.choice([1.0, 0.8, 0.5])
            shape["draft_width"] = rng.choice([None, rng.randint(1, 3 * beam)])
        if rng.random() < 0.2:
            shape["draft_prune_margin"] = rng.choice([0.0, 1.0, 3.0])
        if rng.random() < 0.25:
            shape["gamma_bounds"] = (rng.randint(1, gamma), gamma + rng.randint(0, 3))
        return shape


def run_both(case: Case, target, draft, vocab_info, **options):
    srcs = sources(seed=1000 + case.seed, batch=case.batch)
    src, src_layout = pad(srcs, 0)
    prompts, prompt_layout = pad([case.prompt] * case.batch, 0)
    common = dict(
        beam_size=case.beam_size, len_penalty=case.len_penalty, min_gen_len=case.min_gen_len,
        max_gen_len=case.max_gen_len, **case.extra,
    )  # fmt: skip
    base_gen = BeamSearchSeq2SeqGenerator(target, vocab_info, **common)
    spec_gen = SpeculativeBeamSearchSeq2SeqGenerator(
        target, draft, vocab_info, **{
            "gamma": case.gamma, "draft_strategy": case.strategy, "draft_width": case.draft_width,
            "max_draft_nodes": case.max_draft_nodes, **case.shape, **common, **options,
        },
    )  # fmt: skip
    try:
        base = base_gen(src, src_layout, prompts, prompt_layout)
    except ValueError as error:  # e.g. min_gen_len > max_gen_len for this batch
        with pytest.raises(ValueError, match=str(error).split("`")[1]):
            spec_gen(src, src_layout, prompts, prompt_layout)
        return None  # both refuse the settings, with the same complaint
    return base, spec_gen(src, src_layout, prompts, prompt_layout)


def assert_same(base, spec) -> None:
    assert len(base.hypotheses) == len(spec.hypotheses)
    counted = ("prefill_size", "num_generated_elements")  # fairseq2's meaning of each
    assert [getattr(spec.counters, c) for c in counted] == [
        getattr(base.counters, c) for c in counted
    ]
    for i, (want, got) in enumerate(zip(base.hypotheses, spec.hypotheses, strict=True)):
        assert [h.seq.tolist() for h in got] == [h.seq.tolist() for h in want], f"source {i}"
        for h, g in zip(want, got, strict=True):
            assert float(g.score) == pytest.approx(float(h.score), rel=SCORE_REL, abs=SCORE_TOL)
            assert torch.allclose(h.step_scores, g.step_scores, atol=SCORE_TOL)


@pytest.mark.parametrize("seed", range(120))
def test_equivalence_with_copy_draft(seed, tiny_target, copy_draft, vocab_info) -> None:
    result = run_both(Case.draw(seed), tiny_target, copy_draft, vocab_info)
    if result is not None:
        base, spec = result
        assert_same(base, spec)
        assert spec.stats.source_passes <= spec.stats.steps  # ≥ 1 step per pass and source


@pytest.mark.parametrize("seed", range(120, 220))
def test_equivalence_with_untrained_draft(seed, tiny_target, untrained_draft, vocab_info) -> None:
    result = run_both(Case.draw(seed), tiny_target, untrained_draft, vocab_info)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(220, 260))
def test_equivalence_with_trained_draft(seed, tiny_target, tiny_draft, vocab_info) -> None:
    result = run_both(Case.draw(seed), tiny_target, tiny_draft, vocab_info)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(400, 460))
def test_equivalence_with_draft_heads(seed, tiny_target, untrained_head, random_head, vocab_info):
    """EAGLE-style heads read the target's states: the path from the verification
    into the head's pending chains must never change the output."""
    head = untrained_head if seed % 2 == 0 else random_head
    result = run_both(Case.draw(seed), tiny_target, head, vocab_info, lean_draft=seed % 3 != 0)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(540, 570))
def test_equivalence_with_heads_over_several_layers(seed, tiny_target, fused_head, vocab_info):
    """A head that reads a lower layer too gets it from the verification, through the
    lean target (even seeds) and through fairseq2's modules (odd)."""
    options = {"lean_target": seed % 2 == 0, "lean_draft": seed % 3 != 0}
    result = run_both(Case.draw(seed), tiny_target, fused_head, vocab_info, **options)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(600, 630))
def test_equivalence_when_padded_calls_compute_valid_slots_only(
    seed, tiny_target, tiny_draft, random_head, vocab_info, monkeypatch
) -> None:
    """Sources of a batch draft to different depths and carry chains of different
    lengths; every lean call with padding runs its products over the valid slots only
    (packing from any padding, not from a tenth), drafts and heads alike."""
    monkeypatch.setattr(lean_decoder, "MIN_PADDING", 0.0)
    packed = []
    pack = lean_decoder.Packing.of
    monkeypatch.setattr(
        lean_decoder.Packing,
        "of",
        staticmethod(lambda valid: packed.append(pack(valid)) or packed[-1]),
    )
    case = Case.draw(seed)
    case.batch = max(case.batch, 3)
    case.shape.setdefault("gamma_bounds", (1, case.gamma + 1))
    draft = random_head if seed % 2 else tiny_draft
    result = run_both(case, tiny_target, draft, vocab_info, lean_draft=True)
    if result is not None:
        assert_same(*result)
        assert any(p is not None for p in packed), "no call was packed"


@pytest.mark.parametrize("seed", range(260, 320))
def test_plain_search_without_a_draft_is_fairseq2s(seed, tiny_target, vocab_info) -> None:
    """No draft: specbeam's own beam search, one step per target call on the lean path
    (the planner's fallback), and through fairseq2's modules for the odd seeds."""
    options = {"lean_target": seed % 2 == 0, "plain": "lean"}  # explicit: "auto" depends on oneDNN
    result = run_both(Case.draw(seed), tiny_target, None, vocab_info, **options)
    if result is not None:
        base, plain = result
        assert_same(base, plain)
        assert plain.stats.plain_sources == len(base.hypotheses)
        assert plain.stats.target_passes == 0  # the stats describe speculation only


@pytest.mark.parametrize("seed", range(320, 340))
def test_equivalence_with_fairseq2_modules_for_the_target(
    seed, tiny_target, tiny_draft, vocab_info
) -> None:
    result = run_both(Case.draw(seed), tiny_target, tiny_draft, vocab_info, lean_target=False)
    if result is not None:
        assert_same(*result)


def test_copy_draft_greedy_accepts_everything(tiny_target, copy_draft, vocab_info) -> None:
    """Beam 1 with the target as its own draft: every draft token is accepted, so each
    pass advances γ + 1 steps except the last (which ends at EOS)."""
    case = Case.draw(0)
    case.beam_size, case.gamma, case.strategy, case.batch, case.extra = 1, 3, "linear", 1, {}
    case.min_gen_len, case.max_gen_len = 1, (0.0, 40)
    base, spec = run_both(case, tiny_target, copy_draft, vocab_info)
    assert_same(base, spec)
    hist = spec.stats.tau_histogram
    assert set(hist) - {4} <= {min(hist)}, hist  # all passes but one advance γ + 1 = 4
    assert spec.stats.target_passes == -(-spec.stats.steps // 4)


def test_copy_draft_beam_advances_many_steps_per_pass(tiny_target, copy_draft, vocab_info) -> None:
    """With w = k the draft's beam search is the target's: τ stays far above 1, so a
    generator that quietly ran one pass per step would fail here."""
    case = Case.draw(1)
    case.beam_size, case.gamma, case.strategy, case.draft_width, case.batch = 4, 4, "beam", None, 4
    case.min_gen_len, case.max_gen_len, case.extra = 1, (2.0, 5), {}
    base, spec = run_both(case, tiny_target, copy_draft, vocab_info)
    assert_same(base, spec)
    assert spec.stats.tau > 3.0, spec.stats.to_dict()


def test_untrained_draft_gives_tau_near_one(tiny_target, untrained_draft, vocab_info) -> None:
    case = Case.draw(2)
    case.beam_size, case.gamma, case.batch, case.extra = 4, 4, 4, {}
    base, spec = run_both(case, tiny_target, untrained_draft, vocab_info)
    assert_same(base, spec)
    assert spec.stats.tau < 1.3


def test_stats_are_reported(tiny_target, tiny_draft, vocab_info) -> None:
    case = Case.draw(3)
    case.beam_size, case.gamma, case.batch = 3, 3, 2
    _, spec = run_both(case, tiny_target, tiny_draft, vocab_info)
    stats = spec.stats.to_dict()
    assert stats["target_passes"] > 0 and stats["draft_passes"] == 3 * stats["target_passes"]
    assert sum(stats["tau_histogram"].values()) == stats["source_passes"]
    assert 0.0 <= stats["acceptance_rate"] <= 1.0
    assert stats["peak_target_cache_bytes"] > 0 and stats["peak_draft_cache_bytes"] > 0
    assert all(v >= 0 for v in stats["seconds"].values())


def test_node_budget_bounds_verification(tiny_target, tiny_draft, vocab_info) -> None:
    case = Case.draw(4)
    case.beam_size, case.gamma, case.strategy, case.draft_width, case.batch = 4, 5, "beam", 6, 3
    case.max_gen_len, case.min_gen_len, case.extra = (2.0, 5), 1, {}
    runs = {}
    for budget in (None, 7):
        case.max_draft_nodes = budget
        base, spec = run_both(case, tiny_target, tiny_draft, vocab_info)
        assert_same(base, spec)
        runs[budget] = spec.stats
    full, limited = runs[None], runs[7]
    assert full.drafted_tokens > 7 * full.source_passes
    assert limited.drafted_tokens <= 7 * limited.source_passes
    assert limited.verified_slots < full.verified_slots


def test_rejects_bad_settings(tiny_target, tiny_draft, vocab_info) -> None:
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeBeamSearchSeq2SeqGenerator(tiny_target, tiny_draft, vocab_info, gamma=0)
    with pytest.raises(ValueError, match="draft_width"):
        SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, tiny_draft, vocab_info, beam_size=4, draft_width=2
        )
    with pytest.raises(ValueError, match="max_draft_nodes"):
        SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, tiny_draft, vocab_info, max_draft_nodes=0
        )
    with pytest.raises(ValueError, match="beam_size"):
        SpeculativeBeamSearchSeq2SeqGenerator(tiny_target, tiny_draft, vocab_info, beam_size=0)


def test_batches_above_the_limit_run_plain_beam_search(
    tiny_target, tiny_draft, vocab_info, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="specbeam.search.generator")
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, beam_size=4, gamma=3, max_speculative_batch=2
    )
    beam = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=4)
    for n, speculative in ((2, True), (3, False)):
        assert_plain_iff_not(speculative, generator, beam, batch=n, seed=40)
    assert (
        "more than 2 sentences (decoding.max_speculative_batch) run exact plain beam search"
        in caplog.text
    )
    with pytest.raises(ValueError, match="max_speculative_batch` must be 0 with relaxed"):
        SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, tiny_draft, vocab_info, relax_top=2, relax_gap=1.0,
            max_speculative_batch=2,
        )  # fmt: skip


def assert_plain_iff_not(speculative: bool, generator, beam, *, batch: int, seed: int) -> None:
    """One call of `batch` sources: beam search's output, and speculation or plain search
    (counted as such in the stats) as `speculative` says."""
    src, src_layout = pad(sources(seed=seed, batch=batch), 0)
    prompts, prompt_layout = pad([NLLB_PROMPT] * batch, 0)
    out = generator(src, src_layout, prompts, prompt_layout)
    assert_same(beam(src, src_layout, prompts, prompt_layout), out)
    assert (out.stats.target_passes > 0) == speculative
    assert out.stats.plain_sources == (0 if speculative else batch)


def test_bfloat16_draft_keeps_output_exact(tiny_target, tiny_draft, vocab_info) -> None:
    """The draft's precision only changes proposals; verification stays fp32."""
    draft = copy.deepcopy(tiny_draft).to(torch.bfloat16)
    for seed in range(5):
        case = Case.draw(300 + seed)
        result = run_both(case, tiny_target, draft, vocab_info)
        if result is not None:
            assert_same(*result)


def test_shallow_draft_reuses_the_target_encoder(tiny_target, vocab_info) -> None:
    """A draft decoder over the target's encoder: exact, and the source is encoded once."""
    target = copy.deepcopy(tiny_target)
    torch.manual_seed(5)
    draft = build_shallow_draft(target, DRAFT_ARCH).eval()
    calls = []
    handle = target.encoder.register_forward_hook(lambda *_: calls.append(1))
    try:
        for seed in range(400, 405):
            case = Case.draw(seed)
            calls.clear()
            result = run_both(case, target, draft, vocab_info)
            if result is not None:
                assert_same(*result)
                assert len(calls) == 2  # once for fairseq2's beam search, once for ours
    finally:
        handle.remove()


def _generate(generator, srcs: list[torch.Tensor]):
    src, src_layout = pad(srcs, 0)
    prompts, prompt_layout = pad([NLLB_PROMPT] * len(srcs), 0)
    return generator(src, src_layout, prompts, prompt_layout)


def test_same_inputs_twice_give_identical_output(tiny_target, tiny_draft, vocab_info) -> None:
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, beam_size=4, gamma=3, max_gen_len=(2.0, 5)
    )
    srcs = sources(seed=21, batch=5)
    first, second = _generate(generator, srcs), _generate(generator, srcs)
    for a, b in zip(first.hypotheses, second.hypotheses, strict=True):
        assert [h.seq.tolist() for h in a] == [h.seq.tolist() for h in b]
        assert [float(h.score) for h in a] == [float(h.score) for h in b]  # bit for bit
        assert all(torch.equal(x.step_scores, y.step_scores) for x, y in zip(a, b, strict=True))
    assert first.stats.passes_per_source == second.stats.passes_per_source


def test_a_sentence_decodes_the_same_in_any_company(tiny_target, tiny_draft, vocab_info) -> None:
    # fairseq2 caps generation at a × (longest source in the batch) + b, so a capped
    # output depends on its batch. b = 60 puts the cap far beyond where this sentence's
    # hypotheses end even alone (asserted below): it never binds, so any difference
    # would come from the batch itself (padding, other rows, pass schedule).
    max_gen_len = (1.0, 60)
    sentence = sources(seed=31, batch=1)[0]
    others = sources(seed=32, batch=7)
    gen = torch.Generator().manual_seed(33)
    long = torch.cat([torch.randint(4, 24, (30,), generator=gen), torch.tensor([3])])
    batches = {
        "alone": ([sentence], 0),
        "batch of 8": ([*others[:3], sentence, *others[3:]], 3),
        "long and short": ([long, others[0], sentence, long[10:]], 2),
    }
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, beam_size=4, gamma=3, max_gen_len=max_gen_len
    )
    reference = BeamSearchSeq2SeqGenerator(
        tiny_target, vocab_info, beam_size=4, max_gen_len=max_gen_len
    )
    want = _generate(reference, [sentence]).hypotheses[0]
    assert max(len(h.seq) for h in want) < len(sentence) + max_gen_len[1]
    for company, (srcs, row) in batches.items():
        got = _generate(generator, srcs).hypotheses[row]
        assert [h.seq.tolist() for h in got] == [h.seq.tolist() for h in want], company
        for h, g in zip(want, got, strict=True):
            assert float(g.score) == pytest.approx(float(h.score), rel=SCORE_REL, abs=SCORE_TOL), (
                company
            )


def test_adaptive_gamma_follows_acceptance(
    tiny_target, copy_draft, untrained_draft, vocab_info
) -> None:
    """Depth grows where the draft is always right and shrinks where it is never right;
    the output stays exact either way."""
    case = Case.draw(5)
    case.beam_size, case.gamma, case.strategy, case.draft_width, case.batch = 4, 2, "beam", None, 4
    case.min_gen_len, case.max_gen_len, case.extra, case.max_draft_nodes = 1, (2.0, 5), {}, None
    runs = {}
    for name, draft, bounds in [
        ("copy, fixed", copy_draft, None),
        ("copy, adaptive", copy_draft, (1, 8)),
        ("untrained, fixed", untrained_draft, None),
        ("untrained, adaptive", untrained_draft, (1, 8)),
    ]:
        case.shape = {"gamma_bounds": bounds}
        base, spec = run_both(case, tiny_target, draft, vocab_info)
        assert_same(base, spec)
        runs[name] = spec.stats
    assert runs["copy, adaptive"].tau > runs["copy, fixed"].tau + 0.5
    assert runs["untrained, adaptive"].drafted_tokens < runs["untrained, fixed"].drafted_tokens


def test_out_of_tree_hypotheses_below_the_cut_do_not_stop_a_pass(
    tiny_target, copy_draft, vocab_info, monkeypatch
) -> None:
    """With a node budget the lowest hypotheses fall off the tree; a pass may still go
    on when their best possible children (≤ their own score) rank below the k-th
    non-EOS candidate. Same output, more steps per pass than without that bound."""
    case = Case.draw(6)
    case.beam_size, case.gamma, case.strategy, case.draft_width, case.batch = 4, 4, "beam", None, 8
    case.min_gen_len, case.max_gen_len, case.extra, case.max_draft_nodes = 1, (2.0, 5), {}, 6
    case.shape = {}
    original = BeamAcceptor.__init__

    def unbounded(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        self.bounded = False

    taus = {}
    for bounded in (True, False):
        if not bounded:
            monkeypatch.setattr(BeamAcceptor, "__init__", unbounded)
        base, spec = run_both(case, tiny_target, copy_draft, vocab_info)
        assert_same(base, spec)
        taus[bounded] = spec.stats.tau
    assert taus[True] > taus[False] + 0.05, taus


def test_a_trained_head_advances_more_steps_per_pass(
    tiny_target, tiny_head, untrained_head, vocab_info
) -> None:
    """The states verification hands the head are the ones it was trained on: training
    lifts τ well above an untrained head's, with the same output."""
    case = Case.draw(3)
    case.beam_size, case.gamma, case.strategy, case.draft_width, case.batch = 4, 3, "beam", 8, 6
    case.min_gen_len, case.max_gen_len, case.extra, case.shape = 1, (2.0, 5), {}, {}
    case.max_draft_nodes = None
    tau = {}
    for name, head in (("trained", tiny_head), ("untrained", untrained_head)):
        base, spec = run_both(case, tiny_target, head, vocab_info)
        assert_same(base, spec)
        tau[name] = spec.stats.tau
    assert tau["trained"] > tau["untrained"] + 0.2, tau


@pytest.mark.parametrize("seed", range(24))
def test_equivalence_with_a_head_drafting_from_part_of_the_vocabulary(
    seed, tiny_target, vocab_info, monkeypatch
) -> None:
    """FR-Spec: a head drafting from its most frequent tokens proposes only those (and
    never EOS or padding), and the output is still beam search's."""
    torch.manual_seed(seed)
    head = DraftHead(tiny_target, HeadArch(num_layers=1)).eval()
    head.vocab = torch.randperm(vocab_info.size)
    case = Case.draw(seed)
    keywords = {"draft_strategy": case.strategy, "draft_width": case.draft_width, **case.shape}
    shape = SearchSettings(beam_size=case.beam_size, gamma=case.gamma, **keywords).draft_shape()
    size = shape.width + seed % 5
    allowed = set(head.draft_projection(size, (int(vocab_info.eos_idx), vocab_info.pad_idx))[0].tolist())  # fmt: skip
    drafted: set[int] = set()
    propose = Drafter.propose

    def recording(self, *args):  # noqa: ANN001, ANN202
        tree = propose(self, *args)
        drafted.update(tree.tokens[tree.valid].tolist())
        return tree

    monkeypatch.setattr(Drafter, "propose", recording)
    result = run_both(case, tiny_target, head, vocab_info, draft_vocab=size)
    if result is not None:
        assert_same(*result)
        assert drafted and drafted <= allowed


def test_drafting_from_part_of_the_vocabulary_needs_a_ranked_head(
    tiny_target, copy_draft, vocab_info
) -> None:
    """Asked for explicitly; by default a draft without a ranking drafts from all tokens."""
    case = Case.draw(0)
    case.strategy, case.draft_width, case.extra, case.shape = "beam", None, {}, {}
    with pytest.raises(ValueError, match="needs a draft head"):
        run_both(case, tiny_target, copy_draft, vocab_info, draft_vocab=50)
    head = DraftHead(tiny_target, HeadArch(num_layers=1)).eval()
    with pytest.raises(ValueError, match="ranked vocabulary"):
        run_both(case, tiny_target, head, vocab_info, draft_vocab=50)
    assert_same(*run_both(case, tiny_target, head, vocab_info))


class RandomGate:
    """Turns each source's tree off, or cuts it to any depth up to its own, at random:
    exactness may not depend on the gate's choices."""

    def __init__(self, seed: int) -> None:
        self.rng = torch.Generator().manual_seed(seed)
        self.chosen: list[int] = []

    def depths(self, confidence: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        assert ((confidence >= 0) & (confidence <= 1 + 1e-6)).all()
        pick = (torch.rand(len(depths), generator=self.rng) * (depths + 1)).long()
        self.chosen += pick.tolist()
        return pick.minimum(depths)

    def observe(self, confidence, depths, steps) -> None:
        assert (steps <= depths + 1).all()


@pytest.mark.parametrize("seed", range(700, 760))
def test_equivalence_with_passes_gated_at_random(
    seed, tiny_target, copy_draft, tiny_draft, random_head, vocab_info, monkeypatch
) -> None:
    """Per pass and source the gate may turn the tree off (a plain step) or cut it: the
    output is beam search's whatever it chooses, with draft decoders and heads, and with
    passes where every source of the batch steps plain."""
    gate = RandomGate(seed)
    monkeypatch.setattr(SpeculativeSearchConfig, "gate", lambda self, planner: gate)
    draft = (copy_draft, tiny_draft, random_head)[seed % 3]
    result = run_both(Case.draw(seed), tiny_target, draft, vocab_info)
    if result is not None:
        assert_same(*result)
        if len(gate.chosen) > 8:
            assert 0 in gate.chosen and max(gate.chosen) > 0


@pytest.mark.parametrize("with_draft", [True, False])
def test_a_step_processor_that_bans_eos_ends_at_the_length_limit(
    tiny_target, tiny_draft, vocab_info, with_draft: bool
) -> None:
    """NGramRepeatBlockProcessor(1) over a prompt of EOS bans EOS at every step: fairseq2's
    loop ends at max_seq_len with no finished hypothesis; ours ran past its cache."""
    srcs = sources(seed=77, batch=3)
    src, src_layout = pad(srcs, 0)
    prompts, prompt_layout = pad([torch.tensor([vocab_info.eos_idx])] * 3, 0)
    common = {"step_processors": [NGramRepeatBlockProcessor(1)]}
    base = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, **common)
    spec = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft if with_draft else None, vocab_info, plan=False, **common
    )
    want = base(src, src_layout, prompts, prompt_layout)
    assert any(len(h) < 5 for h in want.hypotheses)  # the case: not all finished
    assert_same(want, spec(src, src_layout, prompts, prompt_layout))
