"""The lean decoder's layer loop (`csrc/lean_layers.cpp`), its attention
(`csrc/attention.cpp`), few-row products (`csrc/few_rows.cpp`), int8 sums on fbgemm
(`csrc/int8_sums.cpp`), exact acceptance's replay and its candidates (`csrc/accept.cpp`,
`csrc/top.cpp`), the cache's commit (`csrc/cache.cpp`), the slot table (`csrc/slots.cpp`)
and a call's embedded slots (`csrc/embed.cpp`) compiled, where a C++ compiler is at hand.

Each small op of a decoder call (norms, views, residual adds, attention's transposes,
cache writes: ~30 per layer) costs several times its back-to-back time in Python,
because every product before it streamed weights through the CPU's caches and evicted the
interpreter's working set. The same ATen ops called from C++ skip the interpreter and
give bit-identical logits; the step time this saves is in docs/bench.md.

The extension is built by torch's `cpp_extension` on first use (about two minutes on 2
cores, in `~/.cache/specbeam/native/<hash of sources, torch and Python>` or
`$SPECBEAM_NATIVE_DIR`);
`scripts/setup.sh` builds it (`python -m specbeam.build_native`). Where it cannot be
built the decoder runs its layers, and acceptance its replay, in Python, and the log says
why; so do calls whose tensors are not on the CPU (`module_for`). `hardware.native=false`
switches it off.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, final

import torch
from fairseq2.models.transformer import StandardTransformerDecoderLayer, TransformerDecoder
from fairseq2.nn import StandardLayerNorm
from torch import Tensor

from specbeam.search import attention, onednn
from specbeam.search.runtime import Runtime

if TYPE_CHECKING:  # the cache calls this module
    from specbeam.search.cache import CrossAttentionState, SpeculativeSelfAttentionState

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
NAMES = "module lean_layers attention few_rows int8_sums accept top cache slots embed"
SOURCES = [CSRC / f"{name}.cpp" for name in NAMES.split()]
HEADERS = [CSRC / name for name in ("native.h", "vec.h")]


NAME = "specbeam_native"
FLAGS = ["-O2", "-ffp-contract=off", "-fopenmp"]
"""No product fused with the add after it: the C++ rounds as ATen's op-by-op kernels do.
OpenMP: ATen's `parallel_for` is a header whose loop runs on one thread unless the
caller is compiled with it (it then shares torch's OpenMP runtime and thread count)."""
LINK_FLAGS = ["-fopenmp"]


def build_dir() -> Path:
    """Where the extension is built: one directory per set of sources (headers included),
    flags, torch and Python version, so that a cached build is never stale."""
    key = hashlib.sha256(
        b"".join(path.read_bytes() for path in SOURCES + HEADERS)
        + f"{torch.__version__} {sys.version} {FLAGS} {LINK_FLAGS}".encode()
    ).hexdigest()[:16]
    root = os.environ.get("SPECBEAM_NATIVE_DIR") or Path.home() / ".cache" / "specbeam" / "native"
    return Path(root) / key


@functools.cache
def build() -> ModuleType | None:
    """The compiled extension, built if it is not yet; None where it cannot be. A built
    one is imported directly: torch's `load` would check the build again, a start-up cost
    in every process (docs/bench.md)."""
    where = build_dir()
    built = where / f"{NAME}.so"
    try:
        if not built.exists():
            from torch.utils.cpp_extension import load

            where.mkdir(parents=True, exist_ok=True)
            log.info("building the native layers once (about two minutes on 2 cores) in %s", where)
            return load(
                NAME,
                [str(s) for s in SOURCES],
                extra_cflags=FLAGS,
                extra_ldflags=LINK_FLAGS,
                build_directory=str(where),
            )
        loader = importlib.machinery.ExtensionFileLoader(NAME, str(built))
        spec = importlib.util.spec_from_file_location(NAME, built, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    except Exception as error:  # no compiler, no headers, a failed build: all the same here
        text = str(error).strip()
        log.warning(
            "the lean decoder's native layers could not be built, so they run in Python: %s",
            text.splitlines()[-1] if text else type(error).__name__,
        )
        return None


def module() -> ModuleType | None:
    """The extension, where the current runtime uses it (`Runtime.native`)."""
    return build() if Runtime.current().native else None


def module_for(x: Tensor) -> ModuleType | None:
    """The extension where `x` (any tensor of the call) is on the CPU, the only device its
    kernels run on; None elsewhere, and the caller runs its portable torch path."""
    return module() if x.device.type == "cpu" else None


def _norm(norm: StandardLayerNorm) -> list[Tensor | None]:
    return [norm.weight, norm.bias]


@dataclass(frozen=True)
class _Layer:
    """One layer's fixed arguments: norms, epsilons, products' weights and biases."""

    norms: list[Tensor | None]
    eps: list[float]
    qkv: tuple[list[Tensor], list[Tensor | None]]
    others: list[tuple[Tensor, Tensor | None]]  # self output, cross q, cross output, ffn
    head_dim: int

    @staticmethod
    def of(layer: StandardTransformerDecoderLayer) -> _Layer:
        attn, cross, ffn = layer.self_attn, layer.encoder_decoder_attn, layer.ffn
        norms = (layer.self_attn_layer_norm, layer.encoder_decoder_attn_layer_norm, layer.ffn_layer_norm)  # fmt: skip
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        return _Layer(
            norms=[t for n in norms for t in _norm(n)],
            eps=[float(n.eps) for n in norms],
            qkv=([p.weight for p in projs], [p.bias for p in projs]),
            others=[
                (p.weight, p.bias)
                for p in (
                    attn.output_proj,
                    cross.q_proj,
                    cross.output_proj,
                    ffn.inner_proj,
                    ffn.output_proj,
                )
            ],  # fmt: skip
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
        self_states: Sequence[SpeculativeSelfAttentionState],
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
        from specbeam.search.cache import CrossAttentionState, SpeculativeSelfAttentionState

        for layer in decoder.layers:
            if type(layer.ffn.inner_activation) is not torch.nn.ReLU:
                return f"feed-forward activation {type(layer.ffn.inner_activation).__name__}"
            if layer.self_attn.head_dim > attention.MAX_HEAD_DIM:
                return f"head dim {layer.self_attn.head_dim} above {attention.MAX_HEAD_DIM}"
        if not all(isinstance(s, SpeculativeSelfAttentionState) for s in self_states):
            return "self-attention states other than the speculative cache's"
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
            qkv = onednn.resolve_group(rows, dtype, *layer.qkv)
            if qkv is None:
                return None
            products = [qkv, *(onednn.resolve(rows, dtype, w, b) for w, b in layer.others)]
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


def main() -> None:
    """`python -m specbeam.build_native` (scripts/setup.sh): builds the extension once, so
    that no app waits for it."""
    parser = argparse.ArgumentParser(
        prog="python -m specbeam.build_native",
        description="Builds the lean decoders' native layers once (C++ and OpenMP, about two "
        f"minutes on 2 cores), in $SPECBEAM_NATIVE_DIR or {build_dir().parent}, so that no "
        "app waits for them; an app builds them itself where they are missing.",
    )
    parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    began = time.perf_counter()
    if build() is None:
        raise SystemExit(1)
    print(f"native layers: ready in {time.perf_counter() - began:.1f} s")
