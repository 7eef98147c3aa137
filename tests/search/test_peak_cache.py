"""The peak KV-cache probe: the same measurement for fairseq2's beam search and ours."""

from __future__ import annotations

from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator

from specbeam.apps.compare import models
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.peak_cache import PeakCacheProbe
from tests.search.test_memory import MAX_GEN_LEN, batch


def test_beam_search_peak_exceeds_its_end_of_call_capacity(tiny_target, vocab_info) -> None:
    generator = BeamSearchSeq2SeqGenerator(
        tiny_target, vocab_info, beam_size=4, max_gen_len=MAX_GEN_LEN
    )
    probe = PeakCacheProbe(models(generator))
    try:
        one = generator(*batch(seed=3, n=1))
        alone = probe.take()
        many = generator(*batch(seed=3, n=6))
        together = probe.take()
    finally:
        probe.close()
    # One source keeps its 4 rows to the end: the peak is what fairseq2 reports.
    assert alone == one.counters.cache_capacity > 0
    # Six sources finish at different steps, and their rows are gone by the end.
    assert together > many.counters.cache_capacity
    generator(*batch(seed=3, n=1))
    assert probe.take() == 0  # closed: no hooks left on the model


def test_speculative_peak_is_both_caches_plus_cross_attention(
    tiny_target, tiny_draft, vocab_info
) -> None:
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, beam_size=4, gamma=3, max_gen_len=MAX_GEN_LEN
    )
    assert models(generator) == [tiny_target, tiny_draft]
    args = batch(seed=4, n=1)
    probe = PeakCacheProbe(models(generator))
    try:
        out = generator(*args)
        peak = probe.take()
    finally:
        probe.close()
    src_len = args[0].size(1)
    # Cross-attention keys and values: one row per source (not per hypothesis), fp32.
    cross = sum(
        len(m.decoder.layers) * 2 * src_len * m.model_dim * 4 for m in (tiny_target, tiny_draft)
    )
    stats = out.stats
    assert peak == stats.peak_target_cache_bytes + stats.peak_draft_cache_bytes + cross
