"""Tree-masked decoding equals separate full passes over each node's path."""

from __future__ import annotations

import copy

import pytest
import torch
from fairseq2.nn import BatchLayout
from torch.nn.functional import log_softmax

from specbeam.data.batches import pad
from specbeam.search.slots import SlotTable
from specbeam.search.tree_attention import TreeDecoder, embed_at, tree_bias
from tests.conftest import sources

TOL = 1e-5  # fp32: block-vs-step differences measured ≤ 5e-6


def full_pass_lprobs(model, src: torch.Tensor, path: list[int]) -> torch.Tensor:
    tgt = torch.tensor([path])
    logits = model(src[None], BatchLayout.of(src[None]), tgt, BatchLayout.of(tgt))
    return log_softmax(logits[0, -1], dim=-1)


def random_tree(
    table: SlotTable, roots: torch.Tensor, gen: torch.Generator, depth: int, width: int
):
    """Adds `depth` blocks of `width` nodes, each child of a random slot of the previous block."""
    num_sources = roots.size(0)
    parents_pool = roots
    for _ in range(depth):
        pick = torch.randint(0, parents_pool.size(1), (num_sources, width), generator=gen)
        parents = parents_pool.gather(1, pick)
        tokens = torch.randint(4, 48, (num_sources, width), generator=gen)
        parents_pool = table.add_nodes(
            tokens, parents, torch.ones(num_sources, width, dtype=torch.bool)
        )


def paths(table: SlotTable, prefixes: list[list[list[int]]]) -> list[list[list[int]]]:
    """Token path (prefix + visible slots in order) of every slot."""
    out = []
    for s in range(table.tokens.size(0)):
        rows = []
        for a in range(table.size):
            seen = table.visible[s, a, : table.size].nonzero().flatten().tolist()
            rows.append(prefixes[s][int(table.hyp[s, a])] + table.tokens[s, seen].tolist())
        out.append(rows)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_logprobs_match_full_passes(tiny_target, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    k, srcs = 3, sources(seed=10 + seed, batch=2)
    src, layout = pad(srcs, 0)
    dec = TreeDecoder(tiny_target, src, layout, hyps_per_source=k, capacity=64)
    with torch.inference_mode():
        # Round 1: a 3-token prompt chain on hypothesis 0 and a random tree; commit one
        # path per new hypothesis, from different tree nodes.
        table = SlotTable(2, 3 + 8, src.device)
        prompt = torch.tensor([[3, 5, 7]]).expand(2, 1, 3)
        roots = table.add_chains(prompt, torch.tensor([3, 3]), torch.zeros(2, dtype=torch.int64))
        random_tree(table, roots, gen, depth=2, width=4)
        dec.forward(*table.query(0, table.size))
        prefixes = [[[]] * k for _ in range(2)]
        chosen = torch.tensor([[3, 4, 5], [6, 3, 4]])  # depth-1 slots -> path of 4 slots each
        keep = table.visible[torch.arange(2)[:, None], chosen, : table.size]
        round1 = paths(table, prefixes)
        dec.cache.commit(torch.zeros(2, k, dtype=torch.int64), keep)
        prefixes = [[round1[s][int(chosen[s, i])] for i in range(k)] for s in range(2)]
        assert dec.cache.lens.tolist() == [4, 4]

        # Round 2: one-token chains on all k hypotheses and a deeper tree.
        table = SlotTable(2, k + 12, src.device)
        last = torch.randint(4, 48, (2, k, 1), generator=gen)
        roots = table.add_chains(last, torch.ones(2, dtype=torch.int64), dec.cache.lens)
        random_tree(table, roots, gen, depth=3, width=4)
        logits = dec.logits(dec.forward(*table.query(0, table.size)))
        expected_paths = paths(table, prefixes)
    for s in range(2):
        for a in range(table.size):
            want = full_pass_lprobs(tiny_target, srcs[s], expected_paths[s][a])
            got = log_softmax(logits[s, a], dim=-1)
            assert torch.allclose(got, want, atol=TOL), (s, a, (got - want).abs().max())


def test_round_one_matches_full_passes(tiny_target) -> None:
    gen = torch.Generator().manual_seed(7)
    srcs = sources(seed=20, batch=3)
    src, layout = pad(srcs, 0)
    dec = TreeDecoder(tiny_target, src, layout, hyps_per_source=2, capacity=32)
    table = SlotTable(3, 1 + 10, src.device)
    roots = table.add_chains(
        torch.full((3, 1, 1), 3),
        torch.ones(3, dtype=torch.int64),
        torch.zeros(3, dtype=torch.int64),
    )
    random_tree(table, roots, gen, depth=5, width=2)
    with torch.inference_mode():
        logits = dec.logits(dec.forward(*table.query(0, table.size)))
    for s, rows in enumerate(paths(table, [[[], []]] * 3)):
        for a, path in enumerate(rows):
            want = full_pass_lprobs(tiny_target, srcs[s], path)
            assert torch.allclose(log_softmax(logits[s, a], -1), want, atol=TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_embedding_is_the_front_ends_ops(tiny_target, dtype, use_runtime) -> None:
    """csrc/embed.cpp embeds as embed_at's torch ops do (scale, fp32 positions, clamped
    at the encoder's length), bit for bit, in the weights' dtype."""
    frontend = copy.deepcopy(tiny_target.decoder_frontend).to(dtype)
    assert frontend.scale != 1.0
    tokens = torch.randint(0, 48, (3, 5), generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 7, 8, 9, 9], [10**6, 0, 3, 2, 1]])
    with torch.inference_mode():
        got = embed_at(frontend, tokens, positions)
        use_runtime(native=False)
        want = embed_at(frontend, tokens, positions)
    assert got.dtype == want.dtype == torch.float32 and torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_tree_bias_is_the_masks_ops(dtype, use_runtime) -> None:
    """The tree mask (compiled: one loop for fp32, ATen's ops otherwise) is the torch
    path's: prefixes of different lengths, columns inherited at random, random ancestry."""
    gen = torch.Generator().manual_seed(8)
    lens, k = torch.tensor([6, 0, 3]), 3
    column = torch.randint(0, k, (3, 4, 6), generator=gen)
    visible = torch.rand(3, 4, 7, generator=gen) < 0.5
    got = tree_bias(lens, k, column, visible, dtype)
    use_runtime(native=False)
    want = tree_bias(lens, k, column, visible, dtype)
    assert got.dtype == want.dtype == dtype and torch.equal(got, want)
