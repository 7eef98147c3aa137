"""A pre-LN fairseq2 decoder's forward pass as plain tensor ops.

A small draft's decoder call is mostly Python: the two d256 layers of the embedded
draft compute in a fraction of a millisecond, while fairseq2's module stack (sharded
linears, layouts, bias caches, state-bag lookups) costs as much again, and a pass makes
one draft call per tree level. Drafts, draft heads and (`lean_target`) the target take
this path; a head's training runs the same layer function, so it learns the arithmetic
it drafts with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import final

import torch
from fairseq2.models.transformer import (
    AttentionState,
    StandardFeedForwardNetwork,
    StandardMultiheadAttention,
    StandardTransformerDecoderLayer,
    StandardTransformerEncoderLayer,
    TransformerDecoder,
    TransformerNormOrder,
)
from fairseq2.nn import StandardLayerNorm
from torch import Tensor
from torch.nn.functional import layer_norm

from specbeam.kernels import attention, native, quant
from specbeam.kernels.native_layers import NativeLayers
from specbeam.kernels.onednn import project, projects


def lean_problem(decoder: TransformerDecoder) -> str | None:
    """Why the lean path cannot run this decoder (None: it can)."""
    if getattr(decoder, "dropout", None) is not None:
        return "decoder dropout"
    for layer in decoder.layers:
        if not isinstance(layer, StandardTransformerDecoderLayer):
            return f"layer type {type(layer).__name__}"
        if layer.norm_order != TransformerNormOrder.PRE:
            return f"norm order {layer.norm_order.name}"
        if not isinstance(layer.ffn, StandardFeedForwardNetwork):
            return f"feed-forward network {type(layer.ffn).__name__}"
        for attn in (layer.self_attn, layer.encoder_decoder_attn):
            problem = attention_problem(attn)
            if problem is not None:
                return problem
        norms = (layer.self_attn_layer_norm, layer.encoder_decoder_attn_layer_norm, layer.ffn_layer_norm)  # fmt: skip
        if not all(isinstance(n, StandardLayerNorm) for n in norms):
            return "layer norms other than StandardLayerNorm"
    if not isinstance(getattr(decoder, "layer_norm", None), StandardLayerNorm):
        return "no final StandardLayerNorm"
    return None


def attention_problem(attn: object) -> str | None:
    """Why the lean path cannot run this attention layer (None: it can)."""
    if not isinstance(attn, StandardMultiheadAttention):
        return f"attention type {type(attn).__name__}"
    if attn.num_key_value_heads != attn.num_heads:
        return "grouped-query attention"
    scale = getattr(attn.sdpa, "scale", None)
    if attn.q_norm or attn.k_norm or attn.pos_encoder or scale is not None:
        return "attention with norms, positions or a custom scale"
    return None


def _norm(x: Tensor, norm: StandardLayerNorm) -> Tensor:
    return layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _heads(x: Tensor, head_dim: int) -> Tensor:
    return x.unflatten(-1, (-1, head_dim))  # (S, T, H, D)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, ordered: bool = False) -> Tensor:
    """q (S, T, H, D), k and v (S, K, H, D), bias (S, 1, T, K) or None -> (S, T, H·D).

    Where `specbeam.kernels.attention`'s kernel runs, every model attends through it (as the
    native layers do): it skips the keys a query does not see, and a beam's query sees one
    of the k prefixes the cache interleaves, so at a beam's shapes it is several times
    faster than torch's SDPA (docs/bench.md). It has no backward: a head's training runs
    SDPA. `ordered` (a quantized model): through `attention.attend` wherever it runs."""
    if ordered or (not q.requires_grad and attention.kernel_runs(q)):
        return attention.attend(q, k, v, bias)
    return attention.sdpa(q, k, v, bias)


MIN_PADDING = 0.1
"""Below this share of padding a call computes every slot: unpacking the logits and the
layers' attention inputs costs about what the few rows save (docs/bench.md, "Figures
behind design choices")."""


@final
@dataclass(frozen=True)
class Packing:
    """The valid slots of an (S, T) call as N packed rows. At batch > 1 sources draft to
    different depths and carry chains of different lengths, so a fifth to a third of the
    slots are padding; the products run over the valid rows only, attention over (S, T)."""

    index: Tensor  # (N,) flat indices of the valid slots into S·T
    shape: tuple[int, int]  # (S, T)

    @staticmethod
    def of(valid: Tensor) -> Packing | None:
        """valid (S, T); None (no packing) where less than `MIN_PADDING` of the slots
        are padding."""
        index = valid.flatten().nonzero().squeeze(1)
        if valid.numel() - index.numel() < MIN_PADDING * valid.numel():
            return None
        return Packing(index, (valid.size(0), valid.size(1)))

    def pack(self, x: Tensor) -> Tensor:
        """(S, T, ...) -> (N, ...)."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """(N, ...) -> (S, T, ...), zeros at padding."""
        out = x.new_zeros((self.shape[0] * self.shape[1], *x.shape[1:]))
        return out.index_copy_(0, self.index, x).unflatten(0, self.shape)


def _unpacked(x: Tensor, packing: Packing | None) -> Tensor:
    return x if packing is None else packing.unpack(x)


def _packed(x: Tensor, packing: Packing | None) -> Tensor:
    return x if packing is None else packing.pack(x)


KeysWith = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
"""(k, v) of the new slots, each (S, T, H, D) -> all keys and values they attend to."""


def decoder_layer(
    layer: StandardTransformerDecoderLayer,
    x: Tensor,
    keys_with: KeysWith,
    self_bias: Tensor | None,
    cross: tuple[Tensor, Tensor],
    cross_bias: Tensor | None,
    packing: Packing | None = None,
) -> Tensor:
    """One pre-LN layer: x (S, T, M), or (N, M) rows of `packing`; cross: the source's
    keys and values (S, K, H, D). Inference appends the new keys to its cache; training a
    head attends across unrolled drafting steps: `keys_with` says which."""
    attn = layer.self_attn
    ordered = quant.attends_in_order(attn)
    h = _norm(x, layer.self_attn_layer_norm)
    projs = (attn.q_proj, attn.k_proj, attn.v_proj)
    q, k, v = (_heads(_unpacked(t, packing), attn.head_dim) for t in projects(h, projs))
    out = _packed(_attend(q, *keys_with(k, v), self_bias, ordered), packing)
    x = x + project(out, attn.output_proj)
    attn = layer.encoder_decoder_attn
    h = _norm(x, layer.encoder_decoder_attn_layer_norm)
    q = project(h, attn.q_proj)
    out = _packed(
        _attend(_heads(_unpacked(q, packing), attn.head_dim), *cross, cross_bias, ordered), packing
    )
    x = x + project(out, attn.output_proj)
    return feed_forward(layer, x)


def feed_forward(
    layer: StandardTransformerDecoderLayer | StandardTransformerEncoderLayer, x: Tensor
) -> Tensor:
    """A pre-LN layer's feed-forward block with its residual (encoder layers alike)."""
    ffn = layer.ffn
    h = project(_norm(x, layer.ffn_layer_norm), ffn.inner_proj)
    return x + project(ffn.inner_activation(h), ffn.output_proj)


def cross_keys(attn: StandardMultiheadAttention, encoder_output: Tensor) -> tuple[Tensor, Tensor]:
    """A cross-attention's keys and values over the encoder output, (S, K, H, D) each."""
    k, v = projects(encoder_output, (attn.k_proj, attn.v_proj))
    return k.unflatten(-1, (-1, attn.head_dim)), v.unflatten(-1, (-1, attn.head_dim))


def final_norm(decoder: TransformerDecoder, x: Tensor) -> Tensor:
    norm = decoder.layer_norm
    assert isinstance(norm, StandardLayerNorm)
    return _norm(x, norm)


@final
class LeanDecoder:
    """Same arithmetic as fairseq2's decoder (pre-LN layers), reading the same weights
    and the same incremental states, without the module machinery."""

    def __init__(
        self,
        decoder: TransformerDecoder,
        self_states: Sequence[AttentionState],
        cross_states: Sequence[AttentionState],
    ) -> None:
        problem = lean_problem(decoder)
        if problem is not None:
            raise ValueError(f"the lean decoder cannot run this model: {problem}")
        self.decoder = decoder
        self.self_states = self_states
        self.cross_states = cross_states
        self.native: NativeLayers | None = None
        if NativeLayers.problem(decoder, self_states, cross_states) is None:
            self.native = NativeLayers(decoder, self_states, cross_states)  # type: ignore[arg-type]

    def __call__(
        self,
        x: Tensor,
        self_bias: Tensor,
        cross_bias: Tensor | None,
        taps: Sequence[int] = (),
        packing: Packing | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """x (S, T, M) embedded new slots; self_bias (S, 1, T, keys); cross_bias
        (S, 1, 1, source length) masks source padding, None without padding. Returns the
        final states and the outputs of layers `taps` (a draft head's features); with
        `packing`, as its (N, ·) rows."""
        ext = native.module_for(x) if self.native is not None else None
        if ext is not None:
            assert self.native is not None
            index = None if packing is None else packing.index
            out = self.native(ext, x, self_bias, cross_bias, taps, index)
            if out is not None:
                return out
        layers, tapped = self.decoder.layers, []
        x = _packed(x, packing)
        states = zip(layers, self.self_states, self.cross_states, strict=True)
        for i, (layer, own, cross) in enumerate(states):
            x = decoder_layer(layer, x, _cached(own), self_bias, cross.get(), cross_bias, packing)
            if i in taps:
                tapped.append(x)
        return final_norm(self.decoder, x), tapped


def _cached(state: AttentionState) -> KeysWith:
    def keys_with(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        state.append(k, v)
        return state.get()

    return keys_with


def padding_bias(
    seq_lens: list[int], length: int, dtype: torch.dtype, device: torch.device
) -> Tensor | None:
    """Additive (S, 1, 1, length) mask of the source padding; None where no source is
    shorter than `length`, the encoder output's padded length."""
    if min(seq_lens, default=length) == length:
        return None
    lens = torch.tensor(seq_lens, device=device)
    pad = torch.arange(length, device=device)[None, :] >= lens[:, None]
    bias = torch.zeros(pad.shape, dtype=dtype, device=device).masked_fill_(pad, -torch.inf)
    return bias[:, None, None, :]
