"""A pre-LN fairseq2 encoder's forward pass as plain tensor ops.

fairseq2's modules run the encoder on PyTorch's default (MKL) linears; the packed oneDNN
linears of `specbeam.kernels.onednn` encode a sentence markedly faster, with outputs within
fp32 rounding. Decoders on the lean path (`lean_target`) encode here too, for batches of
at most `MAX_TOKENS` padded source tokens: oneDNN's lead shrinks as the rows grow and is
lost in the largest batches measured (docs/bench.md).
"""

from __future__ import annotations

from fairseq2.models.transformer import (
    StandardFeedForwardNetwork,
    StandardTransformerEncoder,
    StandardTransformerEncoderLayer,
    TransformerEncoder,
    TransformerNormOrder,
)
from fairseq2.nn import StandardLayerNorm
from fairseq2.nn.residual import AdditiveResidualConnect
from torch import Tensor

from specbeam.kernels import quant
from specbeam.kernels.lean_decoder import (
    _attend,
    _heads,
    _norm,
    attention_problem,
    feed_forward,
    padding_bias,
)
from specbeam.kernels.onednn import project, projects

MAX_TOKENS = 1024


def encoder_problem(encoder: TransformerEncoder) -> str | None:
    """Why the lean path cannot run this encoder (None: it can)."""
    if not isinstance(encoder, StandardTransformerEncoder):
        return f"encoder type {type(encoder).__name__}"
    if encoder._layer_hooks or encoder._forward_hooks or encoder._forward_pre_hooks:
        return "hooks"  # a module's hooks run only through its forward
    if not isinstance(encoder.layer_norm, StandardLayerNorm) or encoder.dropout is not None:
        return "no final StandardLayerNorm, or encoder dropout"
    for layer in encoder.layers:
        if not isinstance(layer, StandardTransformerEncoderLayer):
            return f"layer type {type(layer).__name__}"
        if layer.norm_order != TransformerNormOrder.PRE:
            return f"norm order {layer.norm_order.name}"
        if not isinstance(layer.ffn, StandardFeedForwardNetwork):
            return f"feed-forward network {type(layer.ffn).__name__}"
        problem = attention_problem(layer.self_attn)
        if problem is not None:
            return problem
        residuals = (layer.self_attn_residual, layer.ffn_residual)
        if not all(type(r) is AdditiveResidualConnect for r in residuals):
            return "residual connections other than additive"
        if not all(isinstance(n, StandardLayerNorm) for n in (layer.self_attn_layer_norm, layer.ffn_layer_norm)):  # fmt: skip
            return "layer norms other than StandardLayerNorm"
    return None


def encode(encoder: StandardTransformerEncoder, x: Tensor, seq_lens: list[int]) -> Tensor:
    """x (S, L, M): the front end's output; rows past a source's length are padding, and
    come out as garbage that cross-attention masks."""
    bias = padding_bias(seq_lens, x.size(1), x.dtype, x.device)
    for layer in encoder.layers:
        attn = layer.self_attn
        h = _norm(x, layer.self_attn_layer_norm)
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        q, k, v = (_heads(t, attn.head_dim) for t in projects(h, projs))
        out = _attend(q, k, v, bias, quant.attends_in_order(attn))
        x = x + project(out, attn.output_proj)
        x = feed_forward(layer, x)
    assert isinstance(encoder.layer_norm, StandardLayerNorm)
    return _norm(x, encoder.layer_norm)
