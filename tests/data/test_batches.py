"""Token batches: the bound, every index once, and the leftover batch among the shortest."""

from __future__ import annotations

import random

from specbeam.data.batches import token_batches


def test_every_index_once_and_rows_times_longest_within_the_bound() -> None:
    rng = random.Random(0)
    for seed in (None, 1):
        lengths = [rng.randint(1, 90) for _ in range(300)]
        batches = token_batches(lengths, 1024, seed=seed)
        assert sorted(i for b in batches for i in b) == list(range(300))
        assert all(len(b) * max(lengths[i] for i in b) <= 1024 for b in batches)


def test_a_sentence_longer_than_the_bound_gets_a_batch_of_its_own() -> None:
    assert token_batches([3, 50, 4], 40) == [[1], [2, 0]]


def test_the_leftover_batch_holds_the_shortest_not_a_lone_long_sentence() -> None:
    """Packing from the shortest up left the longest sentence alone here (1 row for all
    its steps); from the longest down, the short leftovers are the small batch."""
    lengths = [10] * 30 + [40] * 8 + [41]  # from the shortest: [30 tens], [8 forties], [41]
    batches = token_batches(lengths, 330)
    assert [len(b) for b in batches] == [8, 8, 23]
    assert {lengths[i] for i in batches[-1]} == {10}
    assert all(lengths[b[0]] == max(lengths[i] for i in b) for b in batches)
