"""The lean decoder computes what fairseq2's decoder computes, on trees, padded batches
and after sources are dropped, and computes the valid slots alone when packed; decoders it
cannot run keep fairseq2's path."""

from __future__ import annotations

import copy
import logging

import torch
from fairseq2.models.transformer import TransformerNormOrder

from specbeam.data.batches import pad
from specbeam.kernels import attention, native
from specbeam.kernels.lean_decoder import Packing, _attend, lean_problem
from specbeam.search.slots import SlotTable
from specbeam.search.tree_attention import TreeDecoder
from tests.conftest import sources
from tests.search.test_tree_attention import TOL, random_tree


def _round(decoders: list[TreeDecoder], gen: torch.Generator, k: int) -> list[torch.Tensor]:
    """One verification-like call on every decoder with the same random tree of one-token
    chains, then the same commit (each hypothesis keeps a depth-1 path)."""
    num_sources = decoders[0].cache.lens.size(0)
    table = SlotTable(num_sources, k + 8, torch.device("cpu"))
    last = torch.randint(4, 48, (num_sources, k, 1), generator=gen)
    roots = table.add_chains(
        last, torch.ones(num_sources, dtype=torch.int64), decoders[0].cache.lens
    )
    random_tree(table, roots, gen, depth=2, width=4)
    outs = [dec.logits(dec.forward(*table.query(0, table.size))) for dec in decoders]
    chosen = torch.randint(k, k + 4, (num_sources, k), generator=gen)
    keep = table.visible[torch.arange(num_sources)[:, None], chosen, : table.size]
    origin = torch.randint(0, k, (num_sources, k), generator=gen)
    for dec in decoders:
        dec.cache.commit(origin, keep)
    return outs


def test_lean_decoder_matches_fairseq2s(tiny_target) -> None:
    gen = torch.Generator().manual_seed(3)
    k, srcs = 2, sources(seed=31, batch=3)
    src, layout = pad(srcs, 0)
    assert len({len(s) for s in srcs}) > 1, "the batch must be padded"
    plain, lean = (
        TreeDecoder(tiny_target, src, layout, hyps_per_source=k, capacity=64, lean=flag)
        for flag in (False, True)
    )
    assert plain.lean is None and lean.lean is not None
    with torch.inference_mode():
        for _ in range(3):
            want, got = _round([plain, lean], gen, k)
            assert torch.allclose(got, want, atol=TOL), (got - want).abs().max()
        keep = torch.tensor([2, 0])  # drop a source, as when it finishes
        for dec in (plain, lean):
            dec.select_sources(keep)
        want, got = _round([plain, lean], gen, k)
    assert torch.allclose(got, want, atol=TOL), (got - want).abs().max()


def test_decoders_the_lean_path_cannot_run_keep_fairseq2s(tiny_target, caplog) -> None:
    caplog.set_level(logging.INFO, logger="specbeam.search.tree_attention")
    post = copy.deepcopy(tiny_target)
    post.decoder.layers[1].norm_order = TransformerNormOrder.POST
    assert lean_problem(post.decoder) == "norm order POST"
    src, layout = pad(sources(seed=5, batch=1), 0)
    dec = TreeDecoder(post, src, layout, hyps_per_source=1, capacity=16, lean=True)
    assert dec.lean is None
    assert "runs through fairseq2's modules: norm order POST" in caplog.text


def test_packed_calls_compute_the_valid_slots_as_unpacked_ones_do(tiny_target) -> None:
    """Batches of sources of different depths pad their slot tables: packed, the valid
    slots get the same states and logits, the padding zeros, and the caches the same keys
    wherever a valid slot can see them (the next call reads them)."""
    gen = torch.Generator().manual_seed(11)
    k, srcs = 2, sources(seed=17, batch=3)
    src, layout = pad(srcs, 0)
    plain, packed = (
        TreeDecoder(tiny_target, src, layout, hyps_per_source=k, capacity=64, lean=True)
        for _ in range(2)
    )
    with torch.inference_mode():
        for _ in range(3):
            table = SlotTable(3, k + 8, torch.device("cpu"))
            last = torch.randint(4, 48, (3, k, 1), generator=gen)
            roots = table.add_chains(last, torch.ones(3, dtype=torch.int64), plain.cache.lens)
            random_tree(table, roots, gen, depth=2, width=4)
            table.valid[:, k:] &= torch.rand(3, 8, generator=gen) < 0.6  # pruned nodes
            seen = table.visible[:, : table.size, : table.size]
            valid = table.valid[:, : table.size]
            valid &= ~(seen & ~valid[:, None, :]).any(-1)  # and their descendants
            packing = Packing.of(valid)
            assert packing is not None and packing.index.numel() == int(valid.sum())
            want = plain.logits(plain.forward(*table.query(0, table.size)))
            got = packed.logits(
                packed.forward(*table.query(0, table.size), packing=packing), packing
            )
            assert torch.allclose(got[valid], want[valid], atol=TOL), (
                (got - want)[valid].abs().max()
            )
            assert not got[~valid].any()
            # Each hypothesis keeps a valid node (or its root) and the path above it.
            chosen = torch.stack([
                torch.where(valid[s, k:], torch.arange(k, table.size), s % k).max().expand(k)
                for s in range(3)
            ])  # fmt: skip
            keep = table.visible[torch.arange(3)[:, None], chosen, : table.size]
            origin = torch.randint(0, k, (3, k), generator=gen)
            for dec in (plain, packed):
                dec.cache.commit(origin, keep)


def test_calls_with_little_padding_are_not_packed() -> None:
    valid = torch.ones(4, 30, dtype=torch.bool)
    assert Packing.of(valid) is None
    valid[0, :2] = False  # 2 of 120: unpacking would cost what the rows save
    assert Packing.of(valid) is None
    valid[1:3, :10] = False
    packing = Packing.of(valid)
    assert (
        packing is not None
        and packing.index.tolist() == valid.flatten().nonzero().flatten().tolist()
    )
    x = torch.randn(4, 30, 3)
    assert torch.equal(packing.unpack(packing.pack(x)), x * valid[..., None])


def test_fp32_attention_runs_the_kernel_where_the_extension_is_in_use(use_runtime) -> None:
    """The kernel where the extension is in use; torch's SDPA with `hardware.native` off,
    and where autograd needs a backward (a head's training); both within fp32 rounding."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, n, 3, 16, generator=gen) for n in (5, 9, 9))
    bias = torch.zeros(2, 1, 5, 9).masked_fill_(
        torch.rand(2, 1, 5, 9, generator=gen) < 0.4, -torch.inf
    )
    bias[..., 0] = 0.0
    kernel = native.build().ordered_attention(q, k, v, bias)
    sdpa = attention.sdpa(q, k, v, bias)
    with torch.inference_mode():
        assert torch.equal(_attend(q, k, v, bias), kernel)
        use_runtime(native=False)
        assert torch.equal(_attend(q, k, v, bias), sdpa)
    use_runtime(native=True)
    trained = _attend(q.requires_grad_(), k, v, bias)
    assert trained.requires_grad and torch.equal(trained.detach(), sdpa)
    assert not torch.equal(kernel, sdpa)  # so the checks above tell the two apart
    torch.testing.assert_close(kernel, sdpa, atol=2e-6, rtol=1e-5)
