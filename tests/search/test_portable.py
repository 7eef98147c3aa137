"""The portable path: without the CPU-only layers (the native extension, oneDNN), as on a
device other than the CPU, speculative beam search is still fairseq2's beam search; its
acceptance runs no numpy, and every tensor the search creates is placed where the
tensors at hand are.

Comparison rule as in test_generator.py: identical tokens, scores within SCORE_TOL (the
tree-masked verification rounds fp32 log-probs differently from fairseq2's steps, on
either path).
"""

from __future__ import annotations

import types

import pytest
import torch

from specbeam.data.batches import pad
from specbeam.kernels import native, onednn
from specbeam.search import accept
from specbeam.search.config import MachineSettings, SpeculativeSearchConfig
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from tests.conftest import PROMPT, sources
from tests.search.test_generator import Case, assert_same, run_both

PORTABLE = SpeculativeSearchConfig(machine=MachineSettings(onednn=False, native=False))
"""The generators' machine settings of the portable path: both CPU-only layers off."""


@pytest.fixture
def portable(monkeypatch) -> dict[str, SpeculativeSearchConfig]:
    """Generator options for the portable path. The extension is never even asked for,
    nor a weight packed: either fails the test."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a CPU-only layer on the portable path")

    for module, name in ((native, "build"), (onednn, "packed"), (onednn, "_mkl_few_rows")):
        monkeypatch.setattr(module, name, refuse)
    return {"config": PORTABLE}


@pytest.fixture
def no_numpy(monkeypatch):
    """Any tensor crossing into or out of numpy fails the test."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("numpy on the search's hot path")

    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    monkeypatch.setattr(torch, "from_numpy", refuse)


def test_acceptance_does_not_import_numpy() -> None:
    modules = [v for v in vars(accept).values() if isinstance(v, types.ModuleType)]
    assert not any(m.__name__.split(".")[0] == "numpy" for m in modules)


@pytest.mark.parametrize("seed", range(40))
def test_equivalence_on_the_portable_path(
    seed, tiny_target, copy_draft, untrained_draft, tiny_draft, vocab_info, portable, no_numpy
) -> None:
    draft = (copy_draft, untrained_draft, tiny_draft)[seed % 3]
    result = run_both(Case.draw(seed), tiny_target, draft, vocab_info, **portable)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(400, 420))
def test_equivalence_with_draft_heads_on_the_portable_path(
    seed, tiny_target, untrained_head, fused_head, vocab_info, portable, no_numpy
) -> None:
    head = untrained_head if seed % 2 == 0 else fused_head
    result = run_both(
        Case.draw(seed), tiny_target, head, vocab_info, lean_draft=seed % 3 != 0, **portable
    )
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(260, 280))
def test_plain_search_on_the_portable_path(
    seed, tiny_target, vocab_info, portable, no_numpy
) -> None:
    result = run_both(Case.draw(seed), tiny_target, None, vocab_info, plain="lean", **portable)
    if result is not None:
        assert_same(*result)


def test_relaxed_acceptance_runs_without_numpy(
    tiny_target, tiny_draft, vocab_info, portable, no_numpy
) -> None:
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, beam_size=4, gamma=3, relax_top=3, **portable
    )
    src, src_layout = pad(sources(seed=5, batch=3), 0)
    out = generator(src, src_layout, *pad([PROMPT] * 3, 0))
    assert out.stats.target_passes > 0 and all(len(h) == 4 for h in out.hypotheses)


@pytest.mark.parametrize(
    "options",
    [
        {"beam_size": 4, "gamma": 3},
        {"beam_size": 4, "gamma": 3, "relax_top": 3},
        {"beam_size": 1, "gamma": 3, "draft_strategy": "linear"},
        {"beam_size": 3, "plain": "lean"},
    ],
    ids=["exact", "relaxed", "greedy", "plain"],
)
def test_the_search_creates_no_tensor_on_the_default_device(
    options, tiny_target, tiny_draft, vocab_info, portable
) -> None:
    """With the default device set to "meta" (shapes only, no values), a tensor created
    without its device would break the search; with it, the output is the same."""
    draft = None if "plain" in options else tiny_draft
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, draft, vocab_info, **options, **portable
    )
    inputs = (*pad(sources(seed=9, batch=3), 0), *pad([PROMPT] * 3, 0))
    want = generator(*inputs)
    with torch.device("meta"):
        got = generator(*inputs)
    for want_hyps, got_hyps in zip(want.hypotheses, got.hypotheses, strict=True):
        assert len(want_hyps) == len(got_hyps)
        for w, g in zip(want_hyps, got_hyps, strict=True):
            assert torch.equal(w.seq, g.seq) and torch.equal(w.score, g.score)
            assert torch.equal(w.step_scores, g.step_scores)
