"""Memory budget: a budgeted call decodes in chunks or with a smaller draft, and gives
exactly the unbudgeted output (and fairseq2's), holding less memory at once."""

from __future__ import annotations

import logging

import pytest
import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator

from specbeam.apps.decoding import DecodingConfig, make_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.data.batches import pad
from specbeam.search.config import MachineSettings, SpeculativeSearchConfig
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.memory import MB, DecoderSize, SourceBytes, fit_budget, source_bytes
from tests.conftest import NLLB_PROMPT, sources
from tests.search.test_generator import assert_same

MAX_GEN_LEN = (2.0, 5)


def batch(seed: int, n: int) -> tuple:
    src, src_layout = pad(sources(seed, n), 0)
    prompts, prompt_layout = pad([NLLB_PROMPT] * n, 0)
    return src, src_layout, prompts, prompt_layout


def per_source(target, draft, args: tuple, k: int, depth: int, width: int) -> SourceBytes:
    """What one source of this batch needs, by the batch's own length limit."""
    prompt_len = args[2].size(1)
    max_seq_len = prompt_len + int(MAX_GEN_LEN[0] * args[1].max_seq_len + MAX_GEN_LEN[1])
    return source_bytes(
        DecoderSize.of(target), DecoderSize.of(draft), k=k, prompt_len=prompt_len,
        max_seq_len=max_seq_len, depth=depth, width=width,
    )  # fmt: skip


def spec(
    target, draft, vocab_info, memory_budget_bytes: int | None = None, **kwargs
) -> SpeculativeBeamSearchSeq2SeqGenerator:
    """A generator whose machine has this memory budget (bytes; None: unlimited)."""
    machine = MachineSettings(memory_budget_mb=(memory_budget_bytes or 0) / MB)
    return SpeculativeBeamSearchSeq2SeqGenerator(
        target, draft, vocab_info, config=SpeculativeSearchConfig(machine=machine),
        max_gen_len=MAX_GEN_LEN, **kwargs,
    )  # fmt: skip


def test_chunks_give_the_same_output_and_a_lower_peak(tiny_target, tiny_draft, vocab_info):
    draft = tiny_draft.to(torch.bfloat16)  # the estimate must follow each model's dtype
    try:
        args = batch(seed=7, n=6)
        # Allocated up front, the caches are exactly what the estimate counts.
        settings = dict(beam_size=4, gamma=3, draft_width=6, decode_capacity_increment=None)
        base = BeamSearchSeq2SeqGenerator(
            tiny_target, vocab_info, beam_size=4, max_gen_len=MAX_GEN_LEN
        )(*args)
        whole = spec(tiny_target, draft, vocab_info, **settings)(*args)
        need = per_source(tiny_target, draft, args, k=4, depth=3, width=6)
        # The estimate's caches are exactly what a call allocates.
        assert whole.stats.peak_target_cache_bytes == 6 * need.target_cache
        assert whole.stats.peak_draft_cache_bytes == 6 * need.draft_cache
        budget = 2 * need.total + need.total // 2  # two sources at a time: three chunks
        chunked = spec(tiny_target, draft, vocab_info, memory_budget_bytes=budget, **settings)(
            *args
        )
    finally:
        tiny_draft.to(torch.float32)
    assert_same(base, chunked)
    assert_same(whole, chunked)
    assert chunked.stats.peak_target_cache_bytes == 2 * need.target_cache
    assert chunked.stats.peak_draft_cache_bytes == 2 * need.draft_cache
    assert 2 * need.total <= budget
    assert chunked.stats.steps_per_source == whole.stats.steps_per_source
    assert chunked.stats.passes_per_source == whole.stats.passes_per_source
    assert chunked.stats.steps == whole.stats.steps
    assert chunked.counters.prefill_size == whole.counters.prefill_size


@pytest.mark.parametrize(
    ("gamma", "draft_width", "fits"),
    [(6, 4, (2, 4)), (3, 8, (1, 6))],  # (depth, width) that the budget leaves room for
)
def test_a_source_too_large_shrinks_the_draft(
    gamma, draft_width, fits, tiny_target, tiny_draft, vocab_info, caplog
):
    args = batch(seed=8, n=3)
    settings = dict(
        beam_size=4, gamma=gamma, draft_width=draft_width, decode_capacity_increment=None
    )
    base = BeamSearchSeq2SeqGenerator(
        tiny_target, vocab_info, beam_size=4, max_gen_len=MAX_GEN_LEN
    )(*args)
    whole = spec(tiny_target, tiny_draft, vocab_info, **settings)(*args)
    budget = per_source(tiny_target, tiny_draft, args, 4, *fits).total
    generator = spec(tiny_target, tiny_draft, vocab_info, memory_budget_bytes=budget, **settings)
    with caplog.at_level(logging.WARNING, logger="specbeam.search.generator"):
        small = generator(*args)
        again = generator(*args)
    assert_same(base, small)
    assert_same(whole, small)
    assert_same(small, again)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings  # once per generator
    assert f"shrinks to gamma={fits[0]}, draft_width={fits[1]}" in warnings[0]
    stats = small.stats
    assert stats.draft_passes == fits[0] * stats.target_passes  # the draft's depth per pass
    assert stats.drafted_tokens <= fits[0] * fits[1] * stats.source_passes
    assert stats.peak_target_cache_bytes < whole.stats.peak_target_cache_bytes


def test_impossible_budget_names_the_setting(tiny_target, tiny_draft, vocab_info) -> None:
    args = batch(seed=9, n=2)
    least = per_source(tiny_target, tiny_draft, args, k=4, depth=1, width=4).total
    generator = spec(
        tiny_target, tiny_draft, vocab_info, beam_size=4, gamma=3, memory_budget_bytes=least - 1
    )
    with pytest.raises(ValueError) as error:
        generator(*args)
    message = str(error.value)
    assert message.startswith("hardware.memory_budget_mb is too small")
    assert f"one source of this batch needs {least} bytes" in message
    assert f"the budget is {least - 1} bytes" in message
    assert "gamma=1 and draft_width=4" in message and "\n" not in message


def test_fit_shrinks_depth_before_width() -> None:
    def need(depth: int, width: int) -> int:
        return 100 * depth + 10 * width

    assert fit_budget(10_000, 8, need, depth=4, width=6, min_width=4).sources == 8
    fit = fit_budget(1000, 8, need, depth=4, width=6, min_width=4)
    assert (fit.depth, fit.width, fit.sources, fit.bytes_per_source) == (4, 6, 2, 460)
    fit = fit_budget(300, 8, need, depth=4, width=6, min_width=4)
    assert (fit.depth, fit.width, fit.sources) == (2, 6, 1)
    fit = fit_budget(145, 8, need, depth=4, width=6, min_width=4)
    assert (fit.depth, fit.width, fit.sources) == (1, 4, 1)
    with pytest.raises(ValueError, match="needs 140 bytes"):
        fit_budget(139, 8, need, depth=4, width=6, min_width=4)


def test_hardware_budget_reaches_the_generator(tiny_target, tiny_draft, vocab_info) -> None:
    assert HardwareConfig(memory_budget_mb=0).memory_budget_bytes is None
    hardware = HardwareConfig(memory_budget_mb=1e-4)  # 104 bytes: nothing fits
    generator = make_generator(
        DecodingConfig(max_gen_len=MAX_GEN_LEN), tiny_target, tiny_draft, vocab_info, hardware
    )
    with pytest.raises(ValueError, match=r"memory_budget_mb is too small.* budget is 104 bytes"):
        generator(*batch(seed=10, n=1))
    with pytest.raises(ValueError, match=r"hardware.memory_budget_mb=-1 is invalid: must be ≥ 0"):
        HardwareConfig(memory_budget_mb=-1, threads=1).apply()


def test_adaptive_depth_is_counted_at_its_upper_bound(tiny_target, tiny_draft, vocab_info):
    """The caches must hold the deepest tree adaptive γ may draft, and the estimate too."""
    args = batch(seed=8, n=3)
    settings = dict(
        beam_size=4, gamma=3, draft_width=6, gamma_bounds=(1, 5), decode_capacity_increment=None
    )
    out = spec(tiny_target, tiny_draft, vocab_info, **settings)(*args)
    need = per_source(tiny_target, tiny_draft, args, k=4, depth=5, width=6)
    assert out.stats.peak_target_cache_bytes == 3 * need.target_cache
    fit = spec(tiny_target, tiny_draft, vocab_info, memory_budget_bytes=need.total, **settings)
    chunked = fit(*args)
    assert_same(out, chunked)
    assert chunked.stats.peak_target_cache_bytes == need.target_cache


def test_growing_caches_stay_within_the_estimate(tiny_target, tiny_draft, vocab_info) -> None:
    """Grown 16 positions at a time (fairseq2's default), the caches hold less than the
    length limit needs, and the output does not change."""
    args = batch(seed=11, n=4)
    settings = dict(beam_size=4, gamma=3, draft_width=6)
    grown = spec(tiny_target, tiny_draft, vocab_info, **settings)(*args)
    whole = spec(tiny_target, tiny_draft, vocab_info, decode_capacity_increment=None, **settings)(
        *args
    )
    assert_same(whole, grown)
    need = per_source(tiny_target, tiny_draft, args, k=4, depth=3, width=6)
    assert whole.stats.peak_target_cache_bytes == 4 * need.target_cache
    assert 0 < grown.stats.peak_target_cache_bytes < whole.stats.peak_target_cache_bytes
    assert 0 < grown.stats.peak_draft_cache_bytes < whole.stats.peak_draft_cache_bytes
    with pytest.raises(ValueError, match="`decode_capacity_increment` must be ≥ 1 or None"):
        spec(tiny_target, tiny_draft, vocab_info, decode_capacity_increment=0)
