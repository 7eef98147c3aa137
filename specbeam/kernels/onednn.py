"""Linear layers through oneDNN with weights packed once.

A decoder call multiplies a few rows (beam size, or the verified slots) by every weight
of the decoder. PyTorch's default (MKL) sgemm runs those shapes far below the speed oneDNN
reaches with a weight packed once into its blocked layout, on the AMD CPUs measured
(`docs/bench.md`, Figures behind design choices); CTranslate2 owes much of its lead over
fairseq2 to the same. The packed copies are kept per weight (repacked when its data
changes), for inference only: with autograd on, or where oneDNN cannot run the weight (off
the CPU, or of a type it lacks), this is `torch.nn.functional.linear`. Same arithmetic up
to fp32 rounding.

Which kernel runs an fp32 product is measured per machine (`hardware.kernels: measured`,
`specbeam.kernels.kernel_table`): MKL's sgemm, MKL's packed GEMM (a copy of the weight packed
for one row count, once that count has recurred: beam 5's plain steps are 5 rows every call),
oneDNN's packed GEMM, or, up to `MAX_FEW_ROWS` rows, the compiled extension's own product where
it is in use (`csrc/few_rows.cpp`): oneDNN's op costs tens of microseconds per call beside its
kernel, and a batch-1 decoder call is little else. `kernels: vendor` keeps the rule that chose
before: MKL below `onednn_min_rows` rows (8 on Intel CPUs), the own product within
`AVX512_FEW_ROWS_INPUTS` on AVX-512, else oneDNN. An explicit `onednn_min_rows` sends fewer
rows to MKL under either.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from fairseq2.nn import Projection
from torch import Tensor
from torch.nn.functional import linear as _torch_linear

from specbeam.kernels import cpu, kernel_table, quant
from specbeam.kernels import native as compiled
from specbeam.kernels.runtime import Runtime


class _PerTensor:
    """Values kept while their tensor lives, found by `id`. torch's WeakIdKeyDictionary
    builds a weak reference on every lookup, ten times the cost of this one, and a decoder
    call makes one or two lookups per product."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, Any]] = {}

    def get(self, tensor: Tensor) -> Any:
        entry = self._entries.get(id(tensor))
        return entry[1] if entry is not None and entry[0]() is tensor else None

    def __getitem__(self, tensor: Tensor) -> Any:
        value = self.get(tensor)
        if value is None:
            raise KeyError(id(tensor))
        return value

    def __contains__(self, tensor: Tensor) -> bool:
        return self.get(tensor) is not None

    def __setitem__(self, tensor: Tensor, value: Any) -> None:
        key, entries = id(tensor), self._entries
        entries[key] = (weakref.ref(tensor, lambda _: entries.pop(key, None)), value)


_packed = _PerTensor()
_fused = _PerTensor()  # first weight -> the group's packing
_row_packs = _PerTensor()  # weight -> its MKL packings
PACK_AFTER = 16
"""Uses of a row count before MKL packs a weight for it: a source's length or the last
call of a batch must not cost a copy of the model."""
MAX_ROW_COUNTS = 2
"""Row counts packed per weight: each is a copy of it (the target's 104 MB)."""
MIN_PACKED_ROWS = 4
"""Below this, MKL's packed GEMM loses to its plain one (on the Intel CPU measured: `docs/bench.md`)."""
MAX_FEW_ROWS = 8
"""Rows up to which fp32 products run on the extension's own product (`csrc/few_rows.cpp`)."""
AVX512_FEW_ROWS_INPUTS = 2560
"""Where the CPU has AVX-512, oneDNN's kernels win from fewer rows: the own product takes
a product while its rows' inputs (rows × in) stay within five rows of 512 (`docs/bench.md`,
"Figures behind design choices")."""
_MKL = torch.backends.mkl.is_available()  # a build-time property, read once


def _few_rows(rows: int, dtype: torch.dtype) -> bool:
    return dtype == torch.float32 and rows < Runtime.current().onednn_min_rows


def active() -> bool:
    """Whether `linear` runs on oneDNN under the current runtime (where the weight
    allows)."""
    return Runtime.current().onednn and torch.backends.mkldnn.is_available()


def bf16_native() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX). Without, oneDNN
    refuses bf16 and PyTorch emulates it, slower than fp32."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def int8_native() -> bool:
    """Whether int8 products run fast here: on int8 dot products (VNNI or AMX), or on
    fbgemm's AVX2 GEMM through the extension (`quant.fbgemm_sums`)."""
    return quant.int8_dot() or quant.fbgemm_sums() is not None


def native(precision: str) -> bool:
    """Whether products in `precision` (float32, bfloat16, int8) run on this CPU's own
    instructions, not emulated."""
    if precision == "bfloat16":
        return bf16_native()
    if precision == "int8":
        return int8_native()
    return True


def _runs(weight: Tensor) -> bool:
    if weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if weight.dtype == torch.bfloat16:
        return bf16_native()
    return weight.dtype == torch.float32


def _key(weight: Tensor) -> tuple:
    # `module.to()` swaps a parameter's data in place, an in-place update bumps its
    # version: either way a packed copy is stale. Inference tensors have no version;
    # they are taken to stay as they are.
    version = 0 if weight.is_inference() else weight._version
    return (weight.data_ptr(), weight.dtype, version)


def packed(weight: Tensor) -> Tensor | None:
    """oneDNN's packed copy of `weight` (out, in), made on first use; None where it
    cannot run."""
    key = _key(weight)
    entry = _packed.get(weight)
    if entry is not None and entry[0] == key:
        return entry[1]
    if not _runs(weight):
        return None
    with torch.inference_mode():
        copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    _packed[weight] = (key, copy)
    return copy


@dataclass
class _RowPacks:
    """One weight's MKL packings, by row count, and how often each count was seen."""

    key: tuple
    packed: dict[int, Tensor] = field(default_factory=dict)
    uses: Counter[int] = field(default_factory=Counter)


TORCH, MKL, ONEDNN, BF16, INT8, FEW_ROWS, INT8_FBGEMM = 0, 1, 2, 3, 4, 5, 6
"""How a `Product` runs: `torch.nn.functional.linear`, MKL's packed GEMM, oneDNN's, a
weight's reduced precision (`specbeam.kernels.quant`: int8 sums on `_int_mm` or on
fbgemm), or the extension's few-row product."""


@dataclass(frozen=True, slots=True)
class Product:
    """One product x @ weight.T + bias, resolved for a call's row count and dtype: which
    kernel runs it, on which packed copy. The native layers (`specbeam.kernels.native`)
    run the same resolution, so both paths compute the same numbers."""

    kind: int
    weight: Tensor
    bias: Tensor | None
    packed: Tensor | None = None
    sizes: tuple[int, ...] = ()  # a stacked group's output widths (`linears`)
    settled: bool = True  # False: MKL may pack this weight for this row count later
    copy: quant.Quantized | None = None  # INT8, INT8_FBGEMM, BF16: the weight's copy

    @property
    def scales(self) -> Tensor | None:
        """INT8, INT8_FBGEMM: the weight's per-channel scales."""
        return None if self.copy is None else self.copy.scales

    def __call__(self, x: Tensor) -> Tensor:
        if self.kind in (INT8, INT8_FBGEMM):
            assert self.copy is not None
            return quant.int8_product(x, self.copy, self.bias)
        if self.kind == BF16:
            assert self.packed is not None
            return quant.bf16_product(x, self.packed, self.bias)
        if self.kind == MKL:
            rows = x.numel() // x.size(-1)
            out = torch.ops.mkl._mkl_linear(
                x.reshape(rows, x.size(-1)), self.packed, self.weight, self.bias, rows
            )
            return out.view(*x.shape[:-1], self.weight.size(0))
        if self.kind == ONEDNN:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        if self.kind == FEW_ROWS:
            return compiled.build().few_rows_product(x, self.weight, self.bias)
        return _torch_linear(x, self.weight, self.bias)


def _mkl_few_rows(rows: int, weight: Tensor, bias: Tensor | None) -> Product:
    """MKL's sgemm over few rows; on a copy of `weight` packed for this row count once
    the count has recurred."""
    plain = Product(TORCH, weight, bias)
    if not _MKL or weight.device.type != "cpu" or rows < MIN_PACKED_ROWS:
        return plain
    key, entry = _key(weight), _row_packs.get(weight)
    if entry is None or entry.key != key:
        entry = _row_packs[weight] = _RowPacks(key)
    copy = entry.packed.get(rows)
    if copy is None:
        entry.uses[rows] += 1
        if len(entry.packed) >= MAX_ROW_COUNTS:
            return plain
        if entry.uses[rows] < PACK_AFTER:
            return dataclasses.replace(plain, settled=False)
        with torch.inference_mode():
            copy = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), rows)
        entry.packed[rows] = copy
    return Product(MKL, weight, bias, copy)


@functools.cache
def _avx512() -> bool:
    return "avx512f" in cpu.cpu_flags()


def _own_few_rows(rows: int, weight: Tensor, bias: Tensor | None, any_width: bool = False) -> bool:
    """Whether the extension's few-row product can run this fp32 product (`MAX_FEW_ROWS`;
    unless `any_width`, `AVX512_FEW_ROWS_INPUTS` too, the vendor rule's limit): where the
    extension is in use (`native.module`)."""
    return (
        rows <= MAX_FEW_ROWS
        and (any_width or rows * weight.size(1) <= AVX512_FEW_ROWS_INPUTS or not _avx512())
        and weight.dtype == torch.float32
        and weight.is_contiguous()
        and weight.size(1) % 8 == 0
        and (bias is None or bias.is_contiguous())
        and compiled.module() is not None
    )


FP32_KINDS = dict(zip(kernel_table.FP32_NAMES, (TORCH, MKL, ONEDNN, FEW_ROWS), strict=True))
"""The fp32 kernels the kernel table chooses among, by the names it stores."""


def _fp32(
    rows: int,
    dtype: torch.dtype,
    weight: Tensor,
    bias: Tensor | None,
    onednn_copy: Callable[[Tensor], Tensor | None],
) -> Product:
    """An fp32 product on the kernel the runtime chooses for it: below `onednn_min_rows`
    rows on MKL; else, by `kernels`, the fastest measured here for its shape, or the one
    the vendor rule names (MKL on Intel below 8 rows, the few-row product within its
    limits, oneDNN's packed GEMM)."""
    if _few_rows(rows, dtype):
        return _mkl_few_rows(rows, weight, bias)
    measured = Runtime.current().kernels == "measured" and dtype == torch.float32
    own = _own_few_rows(rows, weight, bias, measured)
    kind = _measured(rows, weight, bias, own) if measured else "few_rows" if own else "onednn"
    if kind == "mkl_packed":
        return _mkl_few_rows(rows, weight, bias)
    if kind != "onednn":
        return Product(FP32_KINDS[kind], weight, bias)
    w = onednn_copy(weight)
    return Product(TORCH, weight, bias) if w is None else Product(ONEDNN, weight, bias, w)


_chosen: dict[tuple, str] = {}
"""(table, rows, out, in, few-row product eligible, threads) -> the table's choice: a
decoder call asks for every product, and the candidates need not be listed again."""


def _measured(rows: int, weight: Tensor, bias: Tensor | None, own: bool) -> str:
    """The kernel the kernel table measured fastest for this product (oneDNN where it
    is the only candidate)."""
    table = kernel_table.current()
    key = (table, rows, weight.size(0), weight.size(1), own, torch.get_num_threads())
    kind = _chosen.get(key)
    if kind is None:
        names = tuple(n for n in FP32_KINDS if _eligible(n, rows, weight, own))
        if len(names) > 1:
            kind = table.choose(rows, weight, names, _timed(weight, bias, names, rows))
        else:  # no choice: oneDNN where it runs, else torch's (`onednn_copy` says)
            kind = names[0] if names else "onednn"
        _chosen[key] = kind
    return kind


def _eligible(name: str, rows: int, weight: Tensor, own: bool) -> bool:
    if name in ("mkl", "mkl_packed"):
        return _MKL and (name == "mkl" or rows >= MIN_PACKED_ROWS)
    if name == "few_rows":
        return own
    return _runs(weight)


def _timed(
    weight: Tensor, bias: Tensor | None, names: tuple[str, ...], rows: int
) -> Callable[[int], dict[str, kernel_table.Candidate]]:
    """The kernels `names` over `copies` copies of `weight` (the weight itself first),
    for the kernel table to time at `rows` rows."""

    def build(copies: int) -> dict[str, kernel_table.Candidate]:
        with torch.inference_mode():
            ws = [weight.detach(), *(weight.detach().clone() for _ in range(copies - 1))]
        made: dict[str, kernel_table.Candidate] = {}
        for name in names:
            if name == "mkl":
                made[name] = lambda x, i: _torch_linear(x, ws[i], bias)
            elif name == "few_rows":
                made[name] = lambda x, i: compiled.build().few_rows_product(x, ws[i], bias)
            elif name == "onednn":
                with torch.inference_mode():
                    packs = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in ws]
                made[name] = lambda x, i, packs=packs: torch.ops.mkldnn._linear_pointwise(
                    x, packs[i], bias, "none", [], ""
                )
            else:
                at = kernel_table.grid_rows(rows)  # the rows the table times
                with torch.inference_mode():
                    packs = [torch.ops.mkl._mkl_reorder_linear_weight(w, at) for w in ws]
                made[name] = lambda x, i, packs=packs: torch.ops.mkl._mkl_linear(
                    x, packs[i], ws[i], bias, x.size(0)
                )
        return made

    return build


def _bypassed(dtype: torch.dtype, weights: Sequence[Tensor]) -> bool:
    """Whether `torch.nn.functional.linear` runs the product: oneDNN's packed copies and
    MKL's are CPU kernels, and for inference only."""
    return (
        not Runtime.current().onednn
        or weights[0].device.type != "cpu"
        or torch.is_grad_enabled()
        or any(dtype != w.dtype for w in weights)
    )


def settings() -> tuple[bool, int, bool, bool, str, int]:
    """What a resolution depends on beside its tensors and row count."""
    runtime = Runtime.current()
    return (
        runtime.onednn, runtime.onednn_min_rows, runtime.native, torch.is_grad_enabled(),
        runtime.kernels, torch.get_num_threads(),
    )  # fmt: skip


def _quantized(rows: int, weight: Tensor, bias: Tensor | None, copy: quant.Quantized) -> Product:
    """The product on `weight`'s `copy` in its precision."""
    if copy.precision == "bfloat16":
        return Product(BF16, weight, bias, copy.data, copy=copy)
    if copy.on_fbgemm(rows):
        return Product(INT8_FBGEMM, weight, bias, copy.fbgemm, copy=copy)
    return Product(INT8, weight, bias, copy.data, copy=copy)


def resolve(rows: int, dtype: torch.dtype, weight: Tensor, bias: Tensor | None) -> Product:
    """How `linear` runs `weight` (in its own dtype) on `rows` rows of `dtype`."""
    if _bypassed(dtype, (weight,)):
        return Product(TORCH, weight, bias)
    return _fp32(rows, dtype, weight, bias, packed)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., in) -> (..., out), as `torch.nn.functional.linear`."""
    return resolve(x.numel() // x.size(-1), x.dtype, weight, bias)(x)


def resolve_projection(rows: int, dtype: torch.dtype, proj: Projection) -> Product:
    """How `project` runs `proj` (a fairseq2 projection with a weight) on `rows` rows of
    `dtype`: a `QuantizedLinear` in its precision, whatever the runtime (every path must
    compute the same numbers); any other as `linear` runs its weight."""
    if isinstance(proj, quant.QuantizedLinear):
        return _quantized(rows, proj.weight, proj.bias, proj.quantized())
    return resolve(rows, dtype, proj.weight, proj.bias)


def project(x: Tensor, proj: Projection) -> Tensor:
    """x (..., in) -> (..., out), as `proj(x)`."""
    return resolve_projection(x.numel() // x.size(-1), x.dtype, proj)(x)


def resolve_group(
    rows: int,
    dtype: torch.dtype,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor | None],
    precision: str | None = None,
) -> Product | None:
    """One product over `weights` stacked (their outputs side by side, widths `sizes`),
    in `precision` (None: their own dtype); None where they are not stacked (`linears`
    then runs them one by one). Weights stacked into one quantized copy keep their rows'
    scales: a row's result is the one its own weight gives."""
    if precision is None and _bypassed(dtype, weights):
        return None
    key = (precision, *(_key(t) for t in (*weights, *(b for b in biases if b is not None))))
    entry = _fused.get(weights[0])
    if entry is None or entry[0] != key:
        if precision is None and not all(_runs(w) for w in weights):
            return None
        with torch.inference_mode():
            stacked = torch.cat([w.detach() for w in weights])
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat([
                    w.new_zeros(w.size(0)) if b is None else b.detach()
                    for w, b in zip(weights, biases, strict=True)
                ])  # fmt: skip
            if precision is None:
                copy = torch.ops.mkldnn._reorder_linear_weight(stacked, None)
            else:
                copy = quant.prepare(stacked, precision)
        entry = (key, copy, stacked, bias, tuple(w.size(0) for w in weights))
        _fused[weights[0]] = entry
    _, copy, stacked, bias, sizes = entry
    if precision is not None:
        return dataclasses.replace(_quantized(rows, stacked, bias, copy), sizes=sizes)
    return dataclasses.replace(_fp32(rows, dtype, stacked, bias, lambda _: copy), sizes=sizes)


def resolve_projections(rows: int, dtype: torch.dtype, projs: Sequence[Projection]) -> Product | None:  # fmt: skip
    """`resolve_group` over `projs`' weights, where they run in one precision."""
    precision = quant.precision_of(projs[0])
    if any(quant.precision_of(p) != precision for p in projs):
        return None
    return resolve_group(rows, dtype, [p.weight for p in projs], [p.bias for p in projs], precision)


def linears(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor | None]) -> list[Tensor]:
    """`linear(x, w, b)` for each (w, b) pair, as one call over the weights stacked and
    packed once: a decoder call at a few rows is bound by streaming weights, and one
    (3M, M) product streams q, k and v faster than three (M, M) ones."""
    group = resolve_group(x.numel() // x.size(-1), x.dtype, weights, biases)
    if group is None:
        return [linear(x, w, b) for w, b in zip(weights, biases, strict=True)]
    return list(group(x).split(group.sizes, dim=-1))


def projects(x: Tensor, projs: Sequence[Projection]) -> list[Tensor]:
    """`project(x, p)` for each projection, stacked as `linears` stacks weights."""
    group = resolve_projections(x.numel() // x.size(-1), x.dtype, projs)
    if group is None:
        return [project(x, p) for p in projs]
    return list(group(x).split(group.sizes, dim=-1))
