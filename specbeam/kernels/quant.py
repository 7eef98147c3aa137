"""The target's linear layers in reduced precision, with every row computed alone.

Exact speculative search reproduces plain beam search on the model it runs; a
verification computes each row beside a different number of other rows than a plain step
does, so a product's result for a row must not depend on the rows beside it:
- `int8`: weights int8 with one scale per output channel; each input row quantised
  with its own scale (its largest magnitude / 127). int8 × int8 products sum exactly in
  int32, and the scales apply per element afterwards, so a row's result is the same in
  any company. One scale per tensor (fbgemm's `quantize_dynamic`) would tie each row to
  the largest row of the call. The sums run on fbgemm's packed GEMM through the
  extension (`csrc/int8_sums.cpp`) wherever it is built: it streams its packed weight
  faster than `torch._int_mm` (oneDNN), whose calls at a step's few rows cost tens of
  microseconds beside their sums, and with AVX2 alone `_int_mm` is a scalar loop. Where
  the CPU has AMX, oneDNN's tiles take the calls of more than `FBGEMM_MAX_ROWS` rows.
  Both kernels give the same integers, so the kernel may change with the row count. fbgemm's AVX2 kernel adds each
  two u8 × s8 products into 16 bits with saturation: where a probe of its sums finds
  that (`fbgemm_full_bits`), weights keep 7 bits (within ±63, `weight_levels`) so that
  no pair saturates.
- `bfloat16`: bf16 weights and inputs, fp32 accumulation and bias; norms, softmax and
  residuals stay fp32 (oneDNN's packed bf16 product, whose rows do not share a sum).

Rounding to 8 bits is not continuous: an input one fp32 ulp away from a rounding
boundary lands on the other side. So the attention between the products must not depend
on a row's company either (`specbeam.kernels.attention`).

`quantize` replaces each fairseq2 linear layer of a model by a `QuantizedLinear` that
keeps its fp32 weight and holds the copy in its precision, and makes its attention's SDPA
attend in order; fairseq2's own generators on the modules, the lean decoders and the
native layers (`specbeam.kernels.onednn.resolve_projection`) read the precision and the
copy from that module, so they compute the same numbers. No tensor carries a mark.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, final

import torch
from fairseq2.nn import ColumnShardedLinear, Linear, Projection, RowShardedLinear, TiedProjection
from torch import Tensor
from torch.nn import Module

from specbeam.kernels import attention, cpu, native

PRECISIONS = ("bfloat16", "int8")
"""Reduced precisions of the target's products (float32: none)."""

_TINY = 1e-30
"""Floor of a row's scale: an all-zero row quantises to zeros, not NaN."""


@dataclass(frozen=True, slots=True)
class Quantized:
    """A weight's copy for its precision: int8 (in, out) and its per-channel scales
    (out,), with fbgemm's packed copy where the sums run there for calls of at most
    `fbgemm_rows` rows; or oneDNN's packed bf16 copy (scales None)."""

    precision: str
    data: Tensor
    scales: Tensor | None
    fbgemm: Tensor | None = None
    fbgemm_rows: int = 0

    def on_fbgemm(self, rows: int) -> bool:
        """Whether an int8 product of `rows` rows sums on fbgemm (else on `_int_mm`)."""
        return rows <= self.fbgemm_rows


FBGEMM_MAX_ROWS = 16
"""Rows up to which int8 sums run on fbgemm where `_int_mm` has AMX (one tile's rows)."""


def int8_dot() -> bool:
    """Whether this CPU has int8 dot products (VNNI or AMX), which `torch._int_mm` runs on
    oneDNN. Without them (AVX2 alone) `_int_mm` is a scalar loop."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(cpu.cpu_flags()))


def fbgemm_sums() -> ModuleType | None:
    """The extension whose fbgemm GEMM sums int8 products, on a CPU with AVX2 where it is
    built (whatever `hardware.native` says: the sums are the same integers on either
    kernel); None: `torch._int_mm` sums them."""
    if "avx2" not in cpu.cpu_flags():
        return None
    return native.build()


def fbgemm_rows() -> int:
    """Rows up to which int8 sums run on fbgemm: `FBGEMM_MAX_ROWS` where `_int_mm` has
    AMX, none without the extension, else all (`docs/bench.md`, "Figures behind design
    choices")."""
    if fbgemm_sums() is None:
        return 0
    return FBGEMM_MAX_ROWS if "amx_int8" in cpu.cpu_flags() else sys.maxsize


@functools.cache
def fbgemm_full_bits(extension: ModuleType) -> bool:
    """Whether fbgemm sums 8-bit weights exactly on this CPU: VNNI adds each u8 × s8
    product into 32 bits, AVX2 adds two into 16 with saturation, which the largest sums
    show (inputs at 127 are 255 once shifted to u8)."""
    return all(
        bool(
            extension.int8_sums(
                torch.full((rows, 512), 127, dtype=torch.int8),
                extension.int8_pack(torch.full((16, 512), w, dtype=torch.int8)),
            )
            .eq(127 * w * 512)
            .all()
        )
        for rows in (1, 5, 27)
        for w in (127, -127)
    )


def weight_levels() -> int:
    """The int8 weights' largest magnitude: 127, or 63 where the sums run on fbgemm and
    it would saturate 8-bit weights' pair sums."""
    return _levels(fbgemm_sums())


def _levels(extension: ModuleType | None) -> int:
    return 127 if extension is None or fbgemm_full_bits(extension) else 63


@torch.inference_mode()
def prepare(weight: Tensor, precision: str) -> Quantized:
    """weight (out, in) fp32 -> its copy in `precision`."""
    if precision == "int8":
        extension = fbgemm_sums()
        scales = weight.abs().amax(1).clamp_min(_TINY).div(_levels(extension))
        q = weight.div(scales[:, None]).round().to(torch.int8)
        packed = None if extension is None else extension.int8_pack(q)
        return Quantized(precision, q.t().contiguous(), scales, packed, fbgemm_rows())
    w = weight.to(torch.bfloat16)
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        w = torch.ops.mkldnn._reorder_linear_weight(w, None)
    return Quantized(precision, w, None)


def int8_product(x: Tensor, copy: Quantized, bias: Tensor | None) -> Tensor:
    """x (..., in) fp32 -> (..., out): each row quantised with its own scale.
    `csrc/lean_layers.cpp: int8_product` runs the same ops in the same order, and runs
    the product where its sums run on fbgemm (the extension is built then): its ten torch
    ops cost more in dispatch than the product at a step's few rows."""
    assert copy.scales is not None
    rows = x.numel() // x.size(-1)
    if copy.on_fbgemm(rows):
        extension = native.build()
        assert extension is not None and copy.fbgemm is not None
        return extension.int8_product(x, True, copy.fbgemm, copy.scales, bias)
    x2 = x.reshape(rows, x.size(-1))
    a = x2.abs().amax(1, keepdim=True).clamp_min(_TINY).div(127)
    qx = x2.div(a).round().to(torch.int8)
    out = torch._int_mm(qx, copy.data).to(torch.float32).mul_(copy.scales).mul_(a)
    if bias is not None:
        out.add_(bias)
    return out.view(*x.shape[:-1], copy.scales.size(0))


def bf16_product(x: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., in) fp32 -> (..., out) fp32 through bf16 weights and inputs. As
    `csrc/lean_layers.cpp: bf16_product`."""
    xb = x.to(torch.bfloat16)
    if w.is_mkldnn:
        out = torch.ops.mkldnn._linear_pointwise(xb, w, None, "none", [], "")
    else:
        out = torch.nn.functional.linear(xb, w)
    out = out.to(torch.float32)
    if bias is not None:
        out.add_(bias)
    return out


def product(x: Tensor, copy: Quantized, bias: Tensor | None) -> Tensor:
    """x @ weight.T + bias on `weight`'s `copy`, in its precision."""
    if copy.precision == "int8":
        return int8_product(x, copy, bias)
    return bf16_product(x, copy.data, bias)


def _version(weight: Tensor) -> tuple:
    return (weight.data_ptr(), weight.dtype, 0 if weight.is_inference() else weight._version)


@final
class QuantizedLinear(Projection):
    """A fairseq2 projection (`plain`) whose products run in `precision`. It holds
    `plain`'s fp32 weight and bias, the same parameters under the same names (state dicts
    and tied weights stay as they were), and their copy in `precision`, made on first use
    and again when the weight changes; `dequantize` puts `plain` back."""

    def __init__(self, plain: Projection, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision} is not one of {', '.join(PRECISIONS)}")
        weight = plain.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            raise ValueError("only fp32 CPU weights (out, in) are quantised")
        super().__init__(plain.input_dim, plain.output_dim)
        self.weight = weight
        self.register_parameter("bias", plain.bias)
        self.precision = precision
        self._plain = (plain,)  # not a submodule: its parameters are this module's
        self._key: tuple | None = None
        self._copy: Quantized | None = None

    def quantized(self) -> Quantized:
        """The weight's copy in `precision`."""
        key = _version(self.weight)
        if key != self._key:
            if self.weight.dtype != torch.float32:
                raise ValueError("a quantized layer cast to another dtype: dequantize it first")
            self._copy, self._key = prepare(self.weight.detach(), self.precision), key
        assert self._copy is not None
        return self._copy

    def forward(self, x: Tensor) -> Tensor:
        return product(x, self.quantized(), self.bias)

    def __getstate__(self) -> dict[str, Any]:
        # A copy quantizes its own weight when first used (oneDNN's and fbgemm's packed
        # copies are opaque).
        return {**super().__getstate__(), "_key": None, "_copy": None}

    def extra_repr(self) -> str:
        return f"{self._plain[0].extra_repr()}, precision={self.precision}"


def precision_of(module: Module) -> str | None:
    """The precision `module`'s products run in; None: its weight's own dtype."""
    return module.precision if isinstance(module, QuantizedLinear) else None


def plain(module: Module) -> Module:
    """`module` as it was before `quantize`."""
    return module._plain[0] if isinstance(module, QuantizedLinear) else module


def _replaceable(module: Module) -> bool:
    """fairseq2's projections that are one product: a sharded one over a gang of one
    (what fairseq2 builds a model's layers with) gathers and reduces nothing."""
    module = plain(module)
    cls = type(module)
    if cls in (Linear, TiedProjection):
        return True
    if cls in (ColumnShardedLinear, RowShardedLinear):
        return module.tp_gang.size == 1
    return False


def _replace(roots: Sequence[Module], replaced: dict[int, Module]) -> None:
    """Replaces, by name, each child of `roots`' modules that `replaced` maps (by id)."""
    for parent in [m for root in roots for m in root.modules()]:
        for name, child in list(parent._modules.items()):
            new = replaced.get(id(child))
            if new is not None:
                setattr(parent, name, new)


def attends_in_order(attn: Module) -> bool:
    """Whether `attn` (an attention module) attends through `specbeam.kernels.attention`,
    in the lean and native layers: its products are quantized."""
    return isinstance(attn.output_proj, QuantizedLinear)


def quantize(model: Module, precision: str, sharing: Sequence[Module] = ()) -> Module:
    """Replaces every fairseq2 linear layer of `model` (the final projection included)
    by a `QuantizedLinear` in `precision`, and makes its attention run as
    `specbeam.kernels.attention` says; float32 leaves it as it is. In place, by name; the
    modules in `sharing` that hold some of `model`'s layers (a draft head holds the
    target's final projection) get the same replacements. The fp32 weights stay."""
    if precision == "float32":
        return model
    if _replaceable(model):
        raise ValueError("a linear layer is replaced in its parent: wrap it in QuantizedLinear")
    projections = [m for m in model.modules() if _replaceable(m)]
    if not projections:
        raise ValueError("it has no fairseq2 linear layers to quantize")
    odd = next((m.weight for m in projections if m.weight.dtype != torch.float32), None)
    if odd is not None:
        raise ValueError(f"its linear layers are {odd.dtype}: only float32 weights are quantized")
    problem = attention.order_problem(model)
    if problem is not None:
        raise ValueError(problem)
    replaced = {id(m): QuantizedLinear(plain(m), precision) for m in projections}
    attention.order(model)
    _replace([model, *sharing], replaced)
    return model


def dequantize(model: Module) -> Module:
    """`model` with each `QuantizedLinear` replaced by its plain module, by name. In place."""
    replaced = {id(m): plain(m) for m in model.modules() if isinstance(m, QuantizedLinear)}
    _replace([model], replaced)
    return model
