"""The lean layers' attention: each query alone, over the keys it sees in key order.

A quantized target rounds attention's outputs to 8 bits in the next product (int8 or
bf16, `specbeam.kernels.quant`), and a quantum is ~1e5 fp32 ulps, so a verification must
compute a query's attention bit for bit as a plain step does. A blocked kernel's sums
follow where the keys sit and how many queries share the call: a verification's tree
slots sit beside the cached prefix, other hypotheses' prefixes are interleaved with a
query's own (`specbeam.search.cache`), and an accepted token's key sits at another index
than a plain step would have written it to. `csrc/attention.cpp` sums each query's
visible keys one after another in key order and skips the masked ones, so its result
depends on nothing else. Skipping them is also what makes it fast: a beam's query sees
one hypothesis' prefix of the k the cache interleaves, where torch's SDPA computes and
masks them all, and at a beam's few queries per call its per-block overhead dominates. So
fp32 models' lean layers attend here too, wherever the extension is in use
(`kernel_runs`); elsewhere they run torch's SDPA.

Where the extension is not built, or off the CPU, a quantized target attends in fp64
rounded back to fp32: the same fp32 result unless the fp64 one lies within ~1e-16 of an
fp32 boundary. The fairseq2 modules of a quantized target (`OrderedSDPA`), the lean
decoders and the native layers all attend here, so fairseq2's own generators run the same
numbers."""

from __future__ import annotations

from typing import Any, final

import torch
from fairseq2.error import NotSupportedError
from fairseq2.models.transformer import SDPA, StandardMultiheadAttention, TorchSDPA
from fairseq2.models.transformer.attention_bias import maybe_get_attention_bias_tensor
from torch import Tensor
from torch.nn import Module
from torch.nn.functional import scaled_dot_product_attention

from specbeam.kernels import native

MAX_HEAD_DIM = 143
"""The widest head `csrc/attention.cpp` keeps in vector registers (eight 16-lane chunks
and a tail)."""


def _kernel(q: Tensor) -> Any:
    if q.device.type != "cpu" or q.size(-1) > MAX_HEAD_DIM:
        return None
    return native.build()


def kernel_runs(q: Tensor) -> bool:
    """Whether an fp32 model's lean layers attend `q` here: fp32, a head dim the kernel
    holds, and the extension in use (`native.module_for`: built, on the CPU, and
    `hardware.native` on)."""
    fits = q.dtype == torch.float32 and q.size(-1) <= MAX_HEAD_DIM
    return fits and native.module_for(q) is not None


def attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """q (S, T, H, D), k and v (S, K, H, D), bias additive (0 or -inf), broadcastable to
    (S, 1, T, K), or None -> (S, T, H·D), fp32."""
    ext = _kernel(q)
    if ext is not None:
        return ext.ordered_attention(q, k, v, bias)
    mask = None if bias is None else bias.double()
    return sdpa(q.double(), k.double(), v.double(), mask).float()


def sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """torch's SDPA on the lean layers' layout: q (S, T, H, D), k and v (S, K, H, D), bias
    broadcastable to (S, 1, T, K) or None -> (S, T, H·D)."""
    out = scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias
    )
    return out.transpose(1, 2).flatten(2)


@final
class OrderedSDPA(SDPA):
    """A quantized fairseq2 attention module's SDPA (a `TorchSDPA`): `attend` over the
    mask the wrapped one would apply."""

    def __init__(self, inner: TorchSDPA) -> None:
        super().__init__()
        self.inner = inner

    def forward(
        self,
        q: Tensor,
        q_layout: Any,
        k: Tensor,
        k_layout: Any,
        v: Tensor,
        bias_cache: Any,
        *,
        needs_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:  # type: ignore[override]
        if needs_weights:
            raise NotSupportedError(f"`{OrderedSDPA}` does not support `needs_weights`.")
        bias = maybe_get_attention_bias_tensor(self.inner.bias, q, q_layout, k_layout, bias_cache)
        return attend(q, k, v, bias).unflatten(-1, (-1, q.size(-1))), None


def ordered(sdpa: TorchSDPA, like: SDPA) -> SDPA:
    """`sdpa`, as an `OrderedSDPA` where `like` is one (a tree call's stand-in for a
    layer's SDPA)."""
    return OrderedSDPA(sdpa) if isinstance(like, OrderedSDPA) else sdpa


def _attentions(model: Module) -> list[StandardMultiheadAttention]:
    return [m for m in model.modules() if isinstance(m, StandardMultiheadAttention)]


def order_problem(model: Module) -> str | None:
    """Why `order` cannot make `model`'s attention attend here (None: it can)."""
    for m in _attentions(model):
        sdpa = m.sdpa.inner if isinstance(m.sdpa, OrderedSDPA) else m.sdpa
        if type(sdpa) is not TorchSDPA or sdpa.scale is not None:
            return f"its attention runs {type(sdpa).__name__}, not TorchSDPA with the default scale"
    return None


def order(model: Module) -> None:
    """Makes every attention module of `model` attend here. In place."""
    for m in _attentions(model):
        if not isinstance(m.sdpa, OrderedSDPA):
            m.sdpa = OrderedSDPA(m.sdpa)
