"""What the speculative generators check of their models and inputs before decoding: a
mismatch that would otherwise fail deep inside a call (an index out of range, a oneDNN
primitive error) or decode quietly wrong (dropout on) is one sentence naming it."""

from __future__ import annotations

import logging

import torch
from fairseq2.models.seq2seq import Seq2SeqModel
from fairseq2.models.transformer import TransformerModel
from torch import Tensor

from specbeam.search.head import DraftHead

log = logging.getLogger(__name__)


def check_pair(model: Seq2SeqModel, draft: Seq2SeqModel | DraftHead | None) -> None:
    """At construction: the draft scores the target's vocabulary (`check_same_vocabulary`;
    a head: over a target of the target's width); a target whose parameters are not
    float32 gets a warning."""
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        log.warning(
            "the target's parameters are %s: the output is exact (fairseq2's beam search's, "
            "the same with and without a draft) for a float32 target only, because "
            "half-precision sums depend on how many rows a product computes; "
            "specbeam.kernels.quant.quantize runs a float32 target's products in bfloat16 "
            "or int8 exactly to itself",
            dtype,
        )
    if draft is None:
        return
    if hasattr(model, "final_proj") and hasattr(draft, "final_proj"):
        check_same_vocabulary(model, draft)
    width = getattr(model, "model_dim", None)
    if isinstance(draft, DraftHead) and width is not None and draft.model_dim != width:
        raise ValueError(
            f"the draft head was built over a target of width {draft.model_dim}, not this "
            f"target's {width}"
        )


def check_same_vocabulary(target: TransformerModel, draft: TransformerModel | DraftHead) -> None:
    """A draft scores the target's tokens: the same output size and padding index."""
    t, d = target.final_proj.output_dim, draft.final_proj.output_dim
    if t != d:
        raise ValueError(f"draft vocabulary ({d} entries) differs from the target's ({t} entries)")
    if target.pad_idx != draft.pad_idx:
        raise ValueError(
            f"draft pad index {draft.pad_idx} differs from the target's {target.pad_idx}"
        )


def check_call(
    model: Seq2SeqModel,
    draft: Seq2SeqModel | DraftHead | None,
    source_seqs: Tensor,
    prompt_seqs: Tensor,
) -> None:
    """At each call: models in eval mode (the constructor set it; dropout since would
    make every pass random), and a source for every prompt."""
    for name, m in (("target", model), ("draft", draft)):
        if m is not None and m.training:
            raise ValueError(
                f"the {name} model is in training mode (dropout on): call .eval() before generating"
            )
    if len(source_seqs) == 0:
        raise ValueError("the batch is empty: no source sequences to decode")
    if len(prompt_seqs) != len(source_seqs):
        raise ValueError(
            f"{len(source_seqs)} source sequences but {len(prompt_seqs)} prompts: one prompt "
            "per source"
        )
