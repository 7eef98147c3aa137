"""The speculative KV cache: commit (gather + compaction), rollback, source selection.
Commits run compiled (csrc/cache.cpp) and as torch ops: each commit test runs both."""

from __future__ import annotations

import pytest
import torch
from fairseq2.nn import BatchLayout
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.functional import log_softmax

from specbeam.data.batches import pad
from specbeam.kernels.runtime import Runtime, RuntimeConfig
from specbeam.search.cache import SpeculativeKVCache, surviving_rows
from specbeam.search.slots import SlotTable
from specbeam.search.tree_attention import TreeDecoder
from tests.conftest import sources

CPU = torch.device("cpu")
PATHS = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])


def commit_path(compiled: bool) -> Runtime:
    """The runtime whose commits run compiled or as torch ops (`Runtime.active()`)."""
    return Runtime(RuntimeConfig(native=compiled))


def labelled_cache(num_sources: int, k: int, lens: list[int], spec: int) -> SpeculativeKVCache:
    """A 1-layer cache whose every entry says where it was written: (source, position, hyp)."""
    cache = SpeculativeKVCache(
        1, num_sources, 16, k, 1, 3, device=torch.device("cpu"), dtype=torch.float32
    )
    s, c, i = torch.meshgrid(
        torch.arange(num_sources), torch.arange(16), torch.arange(k), indexing="ij"
    )
    cache.buf[0, :, :, :, :, 0] = torch.stack([s, c, i], -1).float()[None]
    cache.lens = torch.tensor(lens)
    cache.width = max(lens)
    cache.spec_len = spec
    return cache


def entry(cache: SpeculativeKVCache, s: int, pos: int, hyp: int) -> tuple[int, ...]:
    """The label at position `pos` of hypothesis `hyp`'s column."""
    return tuple(int(x) for x in cache.buf[0, 0, s, pos, int(cache.columns[s, hyp, pos]), 0])


def flat_entry(cache: SpeculativeKVCache, s: int, key: int) -> tuple[int, ...]:
    return tuple(int(x) for x in cache.flat()[0, 0, s, key, 0])


@PATHS
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_commit_matches_reference(compiled, data) -> None:
    num_sources = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(1, 4))
    lens = data.draw(st.lists(st.integers(0, 5), min_size=num_sources, max_size=num_sources))
    spec = data.draw(st.integers(1, 3 * k))
    cache = labelled_cache(num_sources, k, lens, spec)
    width = max(lens)
    before = {
        (s, key): flat_entry(cache, s, key)
        for s in range(num_sources)
        for key in range((width + 4) * k)
    }
    origin = torch.tensor(
        [
            data.draw(st.lists(st.integers(0, k - 1), min_size=k, max_size=k))
            for _ in range(num_sources)
        ]
    )
    keep = torch.zeros((num_sources, k, spec), dtype=torch.bool)
    for s in range(num_sources):
        count = data.draw(st.integers(0, min(spec, 16 - lens[s])))  # the labelled cache holds 16
        for i in range(k):
            keep[s, i, data.draw(st.permutations(range(spec)))[:count]] = True
    with commit_path(compiled).active():
        cache.commit(origin, keep)
    for s in range(num_sources):
        kept = int(keep[s, 0].sum())
        assert int(cache.lens[s]) == lens[s] + kept
        for i in range(k):
            for pos in range(lens[s]):  # the prefix of the origin hypothesis
                assert entry(cache, s, pos, i) == before[(s, pos * k + int(origin[s, i]))]
            slots = keep[s, i].nonzero().flatten().tolist()
            for t, slot in enumerate(slots):  # then its kept slots, in order
                assert entry(cache, s, lens[s] + t, i) == before[(s, width * k + slot)]
    assert cache.width == int(cache.lens.max()) and cache.spec_len == 0


@PATHS
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_committing_one_root_each_is_a_commit_of_that_slot(compiled, data) -> None:
    """A plain step's commit (a slot per hypothesis) leaves the cache as `commit` does
    when each new hypothesis keeps exactly that slot in its mask."""
    num_sources = data.draw(st.integers(1, 3))
    k = data.draw(st.integers(1, 4))
    lens = data.draw(st.lists(st.integers(0, 14), min_size=num_sources, max_size=num_sources))
    spec = data.draw(st.integers(1, 2 * k))
    origin, slot = (
        torch.tensor(
            [data.draw(st.lists(st.integers(0, top), min_size=k, max_size=k)) for _ in lens]
        )
        for top in (k - 1, spec - 1)
    )
    keep = torch.zeros((num_sources, k, spec), dtype=torch.bool)
    keep.scatter_(2, slot[..., None], True)
    caches = [labelled_cache(num_sources, k, lens, spec) for _ in range(2)]
    with commit_path(compiled).active():
        caches[0].commit(origin, keep)
        caches[1].commit(origin, slot)
    assert torch.equal(caches[0].buf, caches[1].buf)
    assert torch.equal(caches[0].lens, caches[1].lens)
    assert (caches[0].width, caches[0].spec_len) == (caches[1].width, caches[1].spec_len)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("roots", [False, True], ids=["kept", "roots"])
def test_compiled_commit_moves_what_the_torch_ops_move(dtype, roots) -> None:
    """Two layers, random entries, after a source left (the buffer's rows then stride over
    the old batch): the same entries, column maps and lengths either way."""
    gen = torch.Generator().manual_seed(3)
    k, spec = 3, 7
    caches = []
    for compiled in (True, False):
        cache = SpeculativeKVCache(2, 4, 12, k, 2, 4, device=CPU, dtype=dtype)
        cache.buf.copy_(torch.randn(cache.buf.shape, generator=gen.manual_seed(3)))
        cache.lens = torch.tensor([4, 2, 5, 0])
        cache.columns = torch.randint(0, k, cache.columns.shape, generator=gen.manual_seed(4))
        cache.width, cache.spec_len = 5, spec
        cache.select_sources(torch.tensor([0, 2, 1]))
        caches.append((compiled, cache))
    assert not caches[0][1].buf.is_contiguous()
    origin = torch.randint(0, k, (3, k), generator=gen.manual_seed(5))
    if roots:
        keep = torch.randint(0, spec, (3, k), generator=gen.manual_seed(6))
    else:
        keep = torch.zeros((3, k, spec), dtype=torch.bool)
        for s, count in enumerate([2, 0, 3]):
            for i in range(k):
                keep[s, i, torch.randperm(spec, generator=gen)[:count]] = True
    for compiled, cache in caches:
        with commit_path(compiled).active():
            cache.commit(origin, keep)
    (_, a), (_, b) = caches
    assert torch.equal(a.buf, b.buf) and torch.equal(a.columns, b.columns)
    assert torch.equal(a.lens, b.lens) and a.width == b.width


def test_select_sources_drops_rows() -> None:
    cache = labelled_cache(3, 2, [2, 4, 1], 0)
    cache.select_sources(torch.tensor([2, 0]))
    assert cache.lens.tolist() == [1, 2] and cache.width == 2
    assert entry(cache, 0, 0, 1) == (2, 0, 1) and entry(cache, 1, 1, 0) == (0, 1, 0)


def test_growth_keeps_live_entries_and_stops_at_the_bound() -> None:
    cache = SpeculativeKVCache(
        1, 2, 10, 2, 1, 3, device=torch.device("cpu"), dtype=torch.float32, increment=4
    )
    assert cache.capacity == 0 and cache.nbytes() == 0
    cache.reserve(5)  # 5 slots over 2 hypotheses: 3 positions, rounded up to 4
    assert cache.capacity == 4
    cache.buf[0, :, :, :, :, 0] = 7.0
    cache.lens, cache.width = torch.tensor([2, 3]), 3
    cache.reserve(6)  # 3 prefix positions + 3 for the new slots
    assert cache.capacity == 8
    assert (cache.buf[0, :, :, :3, :, 0] == 7.0).all()
    assert (cache.buf[0, :, :, 3:] == 0).all()  # never garbage, even where masked
    cache.reserve(12)  # 9 positions: the bound (10) is below the next step (12)
    assert cache.capacity == 10
    assert cache.peak_bytes == cache.nbytes()
    with pytest.raises(RuntimeError, match="capacity was sized too small"):
        cache.reserve(15)
    cache.select_sources(torch.tensor([1]))  # compacts in place: nothing is allocated
    assert cache.capacity == 10 and cache.buf.size(2) == 1 and cache.lens.tolist() == [3]
    assert (cache.buf[0, :, 0, :3, :, 0] == 7.0).all()
    assert cache.peak_bytes == cache.nbytes()


def test_commit_makes_room_for_each_hypothesis_path() -> None:
    """4 slots reserved over 2 hypotheses take 2 positions beyond the prefix, but one
    hypothesis may keep all 4 (a chain): the commit grows the buffer, or refuses past
    the bound (found by test_commit_matches_reference: an IndexError before)."""
    for bound, grows in ((10, True), (5, False)):
        cache = SpeculativeKVCache(
            1, 1, bound, 2, 1, 3, device=torch.device("cpu"), dtype=torch.float32, increment=4
        )
        cache.lens, cache.width = torch.tensor([2]), 2  # a 2-position prefix
        cache.reserve(4)  # 2 + 2 positions
        cache.advance(4)
        assert cache.capacity == 4
        cache.flat()[0, :, 0, 4:8, 0, 0] = torch.arange(5.0, 9.0)
        keep = torch.ones((1, 2, 4), dtype=torch.bool)  # each keeps all 4: 6 positions
        if not grows:
            with pytest.raises(RuntimeError, match="capacity was sized too small"):
                cache.commit(torch.tensor([[0, 1]]), keep)
            continue
        cache.commit(torch.tensor([[0, 1]]), keep)
        assert cache.capacity == 8 and cache.lens.tolist() == [6]
        assert cache.buf[0, 0, 0, 2:6, 1, 0, 0].tolist() == [5.0, 6.0, 7.0, 8.0]


def test_preallocated_cache_refuses_to_grow() -> None:
    cache = labelled_cache(1, 2, [3], 0)
    cache.reserve(2 * 16 - 6)
    with pytest.raises(RuntimeError, match="capacity was sized too small"):
        cache.reserve(2 * 16 - 5)


def full_pass_lprobs(model, src: torch.Tensor, path: list[int]) -> torch.Tensor:
    tgt = torch.tensor([path])
    return log_softmax(
        model(src[None], BatchLayout.of(src[None]), tgt, BatchLayout.of(tgt))[0, -1], -1
    )


def test_rollback_then_redecode_equals_fresh_pass(tiny_target) -> None:
    """Decode a chain and a rejected tree, keep only the chain, decode again: the new
    logits must not see any trace of the rejected nodes."""
    srcs = sources(seed=30, batch=2)
    src, layout = pad(srcs, 0)
    dec = TreeDecoder(tiny_target, src, layout, hyps_per_source=1, capacity=32)
    zeros = torch.zeros(2, dtype=torch.int64)
    with torch.inference_mode():
        table = SlotTable(2, 3 + 4, src.device)
        roots = table.add_chains(
            torch.tensor([[[3, 9, 30]], [[3, 12, 33]]]), torch.tensor([3, 3]), zeros
        )
        rejected = table.add_nodes(
            torch.tensor([[40, 41], [42, 43]]),
            roots.expand(2, 2),
            torch.ones(2, 2, dtype=torch.bool),
        )
        table.add_nodes(
            torch.tensor([[44, 45], [46, 47]]), rejected, torch.ones(2, 2, dtype=torch.bool)
        )
        dec.forward(*table.query(0, table.size))
        keep = torch.zeros((2, 1, table.size), dtype=torch.bool)
        keep[:, :, :3] = True
        dec.cache.commit(torch.zeros((2, 1), dtype=torch.int64), keep)
        table = SlotTable(2, 1, src.device)
        table.add_chains(torch.tensor([[[31]], [[34]]]), torch.tensor([1, 1]), dec.cache.lens)
        logits = dec.logits(dec.forward(*table.query(0, 1)))
    for s, path in enumerate([[3, 9, 30, 31], [3, 12, 33, 34]]):
        assert torch.allclose(
            log_softmax(logits[s, 0], -1), full_pass_lprobs(tiny_target, srcs[s], path), atol=1e-5
        )


def test_bytes_held_counts_live_positions_only() -> None:
    cache = labelled_cache(2, 3, [4, 1], 0)
    per_position = 2 * 3 * 1 * 3 * 4  # K/V × hypotheses × heads × head dim × fp32 bytes
    assert cache.bytes_held() == 5 * per_position
    assert cache.nbytes() == 2 * 16 * per_position
    cache.select_sources(torch.tensor([], dtype=torch.int64))
    assert cache.bytes_held() == 0


def test_a_released_cache_lends_its_buffer_to_the_next() -> None:
    def cache() -> SpeculativeKVCache:
        return SpeculativeKVCache(2, 3, 20, 2, 1, 4, device=CPU, dtype=torch.float32, increment=4)

    first = cache()
    first.reserve(10)
    first.buf.fill_(7.0)
    storage, nbytes = first.buf.data_ptr(), first.nbytes()
    first.release()
    second = cache()
    second.reserve(10)
    assert second.buf.data_ptr() == storage and (second.buf == 0).all()
    assert second.nbytes() == nbytes  # its own part, not the spare's whole storage
    second.release()


def test_commit_moves_no_prefix() -> None:
    """A permutation or a branching hypothesis moves no cached key: the new hypotheses
    take their origins' column maps, and each writes its accepted path into its own
    column after the prefix."""
    cache = labelled_cache(1, 3, [4], 3)
    before = cache.buf.clone()
    keep = torch.zeros((1, 3, 3), dtype=torch.bool)
    keep[0, torch.arange(3), torch.arange(3)] = True  # new hypothesis i keeps slot i
    cache.commit(torch.tensor([[2, 0, 1]]), keep)
    assert cache.columns[0, :, :5].tolist() == [[2] * 4 + [0], [0] * 4 + [1], [1] * 4 + [2]]
    assert torch.equal(cache.buf[:, :, :, :4], before[:, :, :, :4])
    cache.commit(torch.tensor([[1, 1, 0]]), keep)  # hypothesis 1 branches; 2 leaves no child
    assert cache.columns[0, :, :6].tolist() == [
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
        [2, 2, 2, 2, 0, 2],
    ]
    assert torch.equal(cache.buf[:, :, :, :4], before[:, :, :, :4])
    assert [entry(cache, 0, p, 0) for p in range(4)] == [(0, p, 0) for p in range(4)]


@pytest.mark.parametrize(
    "done",
    [[0, 1, 0, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 1, 1], [1, 0, 1, 0, 1], [0, 0, 0, 0, 0]],
)
def test_finished_sources_leave_holes_that_the_last_survivors_fill(done) -> None:
    """Survivors within the first S' rows stay; only the ones beyond move, into the
    finished rows' places, and the cache copies just those rows."""
    done = torch.tensor(done, dtype=torch.bool)
    keep = surviving_rows(done)
    alive = (~done).nonzero().squeeze(1).tolist()
    assert sorted(keep.tolist()) == alive
    assert all(keep[i] == i for i in range(len(keep)) if i in alive)
    cache = labelled_cache(5, 2, [3, 2, 4, 1, 3], 2)
    before = cache.buf.clone()
    lens = cache.lens.clone()
    cache.select_sources(keep)
    assert cache.lens.tolist() == lens[keep].tolist()
    for i, s in enumerate(keep.tolist()):
        assert torch.equal(cache.buf[:, :, i, : int(lens[s])], before[:, :, s, : int(lens[s])])
