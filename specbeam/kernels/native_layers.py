"""A lean decoder's layers as one call into the compiled extension
(`csrc/lean_layers.cpp`): the norms, products, attention and cache writes of every layer
without returning to the interpreter between them (`specbeam.kernels.native` says why)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import final

import torch
from fairseq2.models.transformer import StandardTransformerDecoderLayer, TransformerDecoder
from fairseq2.nn import Projection, StandardLayerNorm
from torch import Tensor

from specbeam.kernels import attention, onednn
from specbeam.kernels.states import CrossAttentionState, SlottedSelfAttentionState


def _norm(norm: StandardLayerNorm) -> list[Tensor | None]:
    return [norm.weight, norm.bias]


@dataclass(frozen=True)
class _Layer:
    """One layer's fixed arguments: norms, epsilons, products' projections."""

    norms: list[Tensor | None]
    eps: list[float]
    qkv: tuple[Projection, ...]
    others: list[Projection]  # self output, cross q, cross output, ffn
    head_dim: int

    @staticmethod
    def of(layer: StandardTransformerDecoderLayer) -> _Layer:
        attn, cross, ffn = layer.self_attn, layer.encoder_decoder_attn, layer.ffn
        norms = (layer.self_attn_layer_norm, layer.encoder_decoder_attn_layer_norm, layer.ffn_layer_norm)  # fmt: skip
        return _Layer(
            norms=[t for n in norms for t in _norm(n)],
            eps=[float(n.eps) for n in norms],
            qkv=(attn.q_proj, attn.k_proj, attn.v_proj),
            others=[
                attn.output_proj,
                cross.q_proj,
                cross.output_proj,
                ffn.inner_proj,
                ffn.output_proj,
            ],
            head_dim=attn.head_dim,
        )


@dataclass(frozen=True)
class _Resolved:
    """A call's fixed arguments for one row count: per layer its norms and products
    (weight, bias, packed copy, int8 scales), and the products' kinds and widths."""

    tensors: list[list[Tensor | None]]
    ints: list[int]


@final
class NativeLayers:
    """A lean decoder's layers as one call into the extension. Each call resolves its
    products as `onednn.linear` would for its row count, so both paths run the same
    kernels on the same packed copies."""

    def __init__(
        self,
        decoder: TransformerDecoder,
        self_states: Sequence[SlottedSelfAttentionState],
        cross_states: Sequence[CrossAttentionState],
    ) -> None:
        self.layers = [_Layer.of(layer) for layer in decoder.layers]
        self.self_states = self_states
        self.cross_states = cross_states
        final = decoder.layer_norm
        assert isinstance(final, StandardLayerNorm)
        self.final = _norm(final)
        self.eps = [e for layer in self.layers for e in layer.eps] + [float(final.eps)]
        self._resolved: dict[tuple, _Resolved] = {}

    @staticmethod
    def problem(
        decoder: TransformerDecoder, self_states: Sequence[object], cross_states: Sequence[object]
    ) -> str | None:
        """Why these layers cannot run natively (None: they can), beside `lean_problem`."""
        for layer in decoder.layers:
            if type(layer.ffn.inner_activation) is not torch.nn.ReLU:
                return f"feed-forward activation {type(layer.ffn.inner_activation).__name__}"
            if layer.self_attn.head_dim > attention.MAX_HEAD_DIM:
                return f"head dim {layer.self_attn.head_dim} above {attention.MAX_HEAD_DIM}"
        if not all(isinstance(s, SlottedSelfAttentionState) for s in self_states):
            return "self-attention states without slot buffers (SlottedSelfAttentionState)"
        if not all(isinstance(s, CrossAttentionState) for s in cross_states):
            return "cross-attention states other than CrossAttentionState"
        return None

    def _resolve(self, rows: int, dtype: torch.dtype) -> _Resolved | None:
        """The layers' products for `rows` rows, as `onednn.linear` would run them; kept
        for the generation call (its weights do not change) once no product waits to be
        packed. None where a q/k/v group is not stacked."""
        key = (rows, dtype, *onednn.settings())
        resolved = self._resolved.get(key)
        if resolved is not None:
            return resolved
        per_layer: list[list[Tensor | None]] = []
        ints: list[int] = []
        settled = True
        for layer in self.layers:
            qkv = onednn.resolve_projections(rows, dtype, layer.qkv)
            if qkv is None:
                return None
            products = [qkv, *(onednn.resolve_projection(rows, dtype, p) for p in layer.others)]
            tensors = list(layer.norms)
            for p in products:
                tensors += (p.weight, p.bias, p.packed, p.scales)
                settled &= p.settled
            per_layer.append(tensors)
            ints += [p.kind for p in products]
            ints += [*qkv.sizes, layer.head_dim]
        resolved = _Resolved(per_layer, ints)
        if settled:
            self._resolved[key] = resolved
        return resolved

    def __call__(
        self,
        ext: ModuleType,
        x: Tensor,
        self_bias: Tensor,
        cross_bias: Tensor | None,
        taps: Sequence[int],
        pack_index: Tensor | None,
    ) -> tuple[Tensor, list[Tensor]] | None:
        """As `LeanDecoder.__call__`; None where a q/k/v group is not stacked (the Python
        path then runs it as separate products)."""
        rows = x.size(0) * x.size(1) if pack_index is None else pack_index.numel()
        resolved = self._resolve(rows, x.dtype)
        if resolved is None:
            return None
        tensors: list[Tensor | None] = []
        start = -1
        for fixed, own, cross in zip(resolved.tensors, self.self_states, self.cross_states, strict=True):  # fmt: skip
            keys, values, start = own.buffers()
            tensors += fixed
            tensors += (keys, values, *cross.get())
        tensors += self.final
        out, *tapped = ext.decode(
            x, tensors, resolved.ints, self.eps, len(self.layers), start, self_bias, cross_bias,
            pack_index, list(taps),
        )  # fmt: skip
        return out, tapped
