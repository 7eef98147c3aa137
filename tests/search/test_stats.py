"""Speculative statistics: per-pass recording and merging across calls."""

from __future__ import annotations

import torch

from specbeam.search.stats import SpecStats


def test_record_and_merge() -> None:
    a = SpecStats(passes_per_source=[0, 0], steps_per_source=[0, 0])
    a.record_pass(
        torch.tensor([0, 1]), torch.tensor([3, 1]), torch.tensor([8, 8]), torch.tensor([4, 0])
    )
    a.record_pass(torch.tensor([1]), torch.tensor([2]), torch.tensor([8]), torch.tensor([2]))
    a.verified_slots, a.draft_passes, a.peak_target_cache_bytes = 50, 6, 100
    assert a.passes_per_source == [1, 2] and a.steps_per_source == [3, 3]
    assert a.tau == 6 / 3 and a.acceptance_rate == 6 / 24
    b = SpecStats()
    b.merge(a)
    b.merge(a)
    counters = (
        "target_passes",
        "draft_passes",
        "source_passes",
        "steps",
        "drafted_tokens",
        "verified_slots",
        "accepted_tokens",
    )
    for name in counters:
        assert getattr(b, name) == 2 * getattr(a, name), name
    assert b.peak_target_cache_bytes == 100
    assert b.tau_histogram == {3: 2, 1: 2, 2: 2}
