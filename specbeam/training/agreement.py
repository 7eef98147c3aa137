"""How often a draft ranks tokens as its target does, under teacher forcing: a bound on
what speculative decoding can accept, measured without decoding anything.

Exact speculative beam search takes a step only when the target's k best continuations
were all drafted, so besides top-1 agreement this counts the positions whose target top k
all lie in the draft's top `width` (the draft tree's width at one level).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from fairseq2.models.transformer import TransformerModel
from torch import Tensor

from specbeam.data.batches import teacher_forcing, token_batches
from specbeam.data.tokens import TokenizedPair
from specbeam.integration.models import Draft
from specbeam.search.head import DraftHead
from specbeam.training.head_data import compute_head_data
from specbeam.training.train_head import unrolled_states


@dataclass(frozen=True)
class Agreement:
    positions: int
    top1: float  # the draft's best token is the target's best
    topk_covered: float  # the target's k best tokens are all among the draft's `width` best
    k: int
    width: int


@torch.inference_mode()
def measure_agreement(
    target: TransformerModel,
    draft: Draft,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    *,
    k: int = 5,
    width: int = 10,
    max_tokens: int = 4096,
    prompt_len: int | None = None,
) -> Agreement:
    """Both models read the same reference prefixes; every non-pad position counts,
    from the last of the `prompt_len` prompt tokens on (given: the positions generation
    predicts, so that drafts and heads count the same ones). A head reads the target's
    states of the prefix (its first drafting level) and needs `prompt_len`."""
    if isinstance(draft, DraftHead):
        if prompt_len is None:
            raise ValueError("a head's agreement needs the prompt length (`prompt_len`)")
        tops = _head_tops(target, draft, pairs, pad_idx, k, width, max_tokens, prompt_len)
    else:
        first = 0 if prompt_len is None else prompt_len - 1
        tops = _model_tops(target, draft, pairs, pad_idx, k, width, max_tokens, first)
    positions = top1 = covered = 0
    for t_top, d_top in tops:  # (P, k) and (P, width) token ids, best first
        positions += len(t_top)
        top1 += int((t_top[:, 0] == d_top[:, 0]).sum())
        covered += int((t_top[:, :, None] == d_top[:, None, :]).any(-1).all(-1).sum())
    return Agreement(positions, top1 / positions, covered / positions, k, width)


def _model_tops(
    target: TransformerModel,
    draft: TransformerModel,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    width: int,
    max_tokens: int,
    first: int,
) -> Iterator[tuple[Tensor, Tensor]]:
    lengths = [len(p.source) + len(p.target) for p in pairs]
    for batch in token_batches(lengths, max_tokens):
        src, src_layout, tgt_in, in_layout, tgt_out = teacher_forcing(
            [pairs[i] for i in batch], pad_idx
        )
        mask = tgt_out != pad_idx  # (N, T)
        mask[:, :first] = False
        t_logits = target(src, src_layout, tgt_in, in_layout)[mask].float()  # (P, V)
        d_logits = draft(src, src_layout, tgt_in, in_layout)[mask].float()
        yield t_logits.topk(k, dim=-1).indices, d_logits.topk(width, dim=-1).indices


def _head_tops(
    target: TransformerModel,
    head: DraftHead,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    width: int,
    max_tokens: int,
    prompt_len: int,
) -> Iterator[tuple[Tensor, Tensor]]:
    data = compute_head_data(
        target, pairs, pad_idx, k, prompt_len=prompt_len, max_tokens=max_tokens, bf16=False,
        feature_layers=head.feature_layers,
    )  # fmt: skip
    for batch in token_batches(data.lengths(), max_tokens):
        rows = data.batch(batch, pad_idx)
        positions = torch.arange(rows.tokens.size(1))[None, :]
        valid = (positions >= prompt_len - 1) & (positions < torch.tensor(rows.lens)[:, None])
        states = unrolled_states(head, rows, 1)[0]
        yield rows.top_idx[valid], head.final_proj(states[valid]).float().topk(width, -1).indices
