"""Token sequences in batches: padding, teacher forcing and token-budget batching."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from fairseq2.nn import BatchLayout
from torch import Tensor

from specbeam.data.tokens import TokenizedPair


def pad(seqs: Sequence[Tensor], pad_idx: int) -> tuple[Tensor, BatchLayout]:
    lens = [len(s) for s in seqs]
    out = torch.full((len(seqs), max(lens)), pad_idx, dtype=torch.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, BatchLayout.of(out, lens)


def teacher_forcing(
    pairs: Sequence[TokenizedPair], pad_idx: int
) -> tuple[Tensor, BatchLayout, Tensor, BatchLayout, Tensor]:
    """Padded sources, decoder inputs (each target but its last token) and the tokens they
    must predict (each target but its first): src, src_layout, tgt_in, in_layout, tgt_out."""
    src, src_layout = pad([p.source for p in pairs], pad_idx)
    tgt, _ = pad([p.target for p in pairs], pad_idx)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    in_layout = BatchLayout.of(tgt_in, [len(p.target) - 1 for p in pairs])
    return src, src_layout, tgt_in, in_layout, tgt_out


def token_batches(
    lengths: Sequence[int], max_tokens: int, seed: int | None = None
) -> list[list[int]]:
    """Groups indices of similar length so that rows × longest stays ≤ max_tokens, packed
    from the longest down, so that the smaller batch left over holds the shortest: a
    long sentence left alone would run all its steps at a few rows (CTranslate2 packs
    its batches so too). Each batch's longest comes first.

    With a seed, lengths are jittered before sorting and batch order is shuffled, so
    every epoch sees different batches; without one the order is deterministic.
    """
    rng = random.Random(seed)
    keyed = sorted(
        range(len(lengths)),
        key=lambda i: lengths[i] + (rng.random() if seed is not None else 0),
        reverse=True,
    )
    batches: list[list[int]] = []
    for i in keyed:
        if batches and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    if seed is not None:
        rng.shuffle(batches)
    return batches
