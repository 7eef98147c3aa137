"""EAGLE-style draft head: decoder layers that read the target's own output states.

A separate draft decoder has to rebuild from the tokens what the target has already
computed; every verification pass returns the target's decoder output for each node, so
the head starts from those (EAGLE, HASS). Per slot it reads the token's embedding (the
target's front-end, frozen) and the parent's target state (after the final norm),
reduced to the model dimension by `feature_proj`; below the first drafted level the
parent's state is the head's own prediction. Its layers attend to the head's own cache
(self-attention) and to the target's encoder output (cross-attention, K/V once per
sentence). Its output goes through the target's final norm and projection, frozen.

With `feature_layers` (EAGLE-3), the parent's target state is the final state together
with the outputs of some lower decoder layers, fused to the model dimension by `fuse`
before `feature_proj`; the head's own predictions (below the first level) stand in for
the fused state. `fuse` starts as the choice of the final state, so a head trained over
the last layer alone is where training over several starts.

The head exposes the attributes a draft `TransformerModel` has (encoder, front-end,
decoder, final projection), so the tree decoder runs it like any other draft; the
encoder, front-end, final norm and projection are the target's modules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, final

import torch
from fairseq2.models.transformer import (
    StandardTransformerDecoder,
    TransformerDecoderLayer,
    TransformerModel,
)
from fairseq2.nn import Linear, Projection, TiedProjection
from torch import Tensor, nn

from specbeam.kernels import quant
from specbeam.kernels.onednn import project
from specbeam.search.stored import stored_settings

HEAD_KIND = "draft_head"
"""The `kind` of a head's checkpoint (`specbeam.integration.models.load_model`)."""
_OWN = ("feature_proj.", "fuse.", "decoder.layers.")


@dataclass(kw_only=True, frozen=True)
class HeadArch:
    num_layers: int = 1
    """Decoder layers, initialised from the target's last ones."""
    feature_layers: tuple[int, ...] = ()
    """The target's decoder layers (0-based, below the last) whose outputs the head also
    reads, beside the final state (EAGLE-3); () reads the final state alone."""


def check_feature_layers(layers: Sequence[int], target: TransformerModel) -> tuple[int, ...]:
    """`layers` as a tuple, if they are distinct, ascending (the order verification taps
    them and the head data stores them) and below the target's last decoder layer."""
    below = len(target.decoder.layers) - 1
    if any(not 0 <= i < below for i in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(
            f"feature_layers are distinct layers 0 to {below - 1} of the target's decoder, "
            f"ascending (the order verification taps them; its last layer gives the final "
            f"state), not {list(layers)}"
        )
    return tuple(layers)


@final
class DraftHead(nn.Module):
    """A draft that drafts from the target's states (see the module docstring)."""

    def __init__(self, target: TransformerModel, arch: HeadArch) -> None:
        super().__init__()
        if not 1 <= arch.num_layers <= len(target.decoder.layers):
            raise ValueError(
                f"a head has 1 to {len(target.decoder.layers)} layers (the target's decoder), "
                f"not {arch.num_layers}"
            )
        taps = check_feature_layers(arch.feature_layers, target)
        dim = target.model_dim
        self.arch = arch
        self.feature_layers = taps
        self.model_dim = dim
        self.pad_idx = target.pad_idx
        self.max_target_seq_len = target.max_target_seq_len
        # A quantized target's layers are copied as they were before (`quantize` says
        # whether the head's run quantized).
        layers: list[TransformerDecoderLayer] = [
            quant.dequantize(copy.deepcopy(layer))
            for layer in list(target.decoder.layers)[-arch.num_layers :]
        ]
        dtype = next(target.decoder.parameters()).dtype
        # [token embedding ; parent state] (2M) -> M
        self.feature_proj: Projection = Linear(2 * dim, dim, bias=True, dtype=dtype)
        # [layer outputs ; final state] ((L + 1) M) -> M; no bias, so that the prompt's
        # zero states stay zero.
        self.fuse: Projection | None = None
        if taps:
            self.fuse = Linear((len(taps) + 1) * dim, dim, bias=False, dtype=dtype)
            with torch.no_grad():
                self.fuse.weight.zero_()[:, -dim:] = torch.eye(
                    dim, dtype=dtype, device=self.fuse.weight.device
                )
        self.decoder = StandardTransformerDecoder(layers, target.decoder.layer_norm)
        self.encoder_frontend, self.encoder = target.encoder_frontend, target.encoder
        self.decoder_frontend, self.final_proj = target.decoder_frontend, target.final_proj
        self.vocab: Tensor | None = None
        """Token ids by frequency on the target side of the training data, most frequent
        first (None: not ranked): what `draft_vocab` (FR-Spec) drafts from."""
        self._projections: dict[tuple[int, tuple[int, ...]], tuple[Tensor, Projection]] = {}

    def draft_projection(self, size: int, excluded: tuple[int, ...]) -> tuple[Tensor, Projection]:
        """The `size` most frequent tokens but `excluded` and a projection of the output
        projection's rows that score them, in its precision, kept per size: a new weight
        tensor would be packed again by every call (specbeam/kernels/onednn.py)."""
        key = (size, excluded)
        if key not in self._projections:
            if self.vocab is None:
                raise ValueError(
                    "`draft_vocab` needs a head with a ranked vocabulary "
                    "(tasks/bible_es_en/rank_vocab.py adds one to a head checkpoint)"
                )
            proj = self.final_proj
            special = torch.tensor(excluded, device=self.vocab.device)
            ranked = self.vocab[~torch.isin(self.vocab, special)][:size].to(proj.weight.device)
            weight = nn.Parameter(proj.weight.index_select(0, ranked), requires_grad=False)
            bias = None
            if proj.bias is not None:
                bias = nn.Parameter(proj.bias.index_select(0, ranked), requires_grad=False)
            rows: Projection = TiedProjection(weight, bias)
            precision = quant.precision_of(proj)
            if precision is not None:
                rows = quant.QuantizedLinear(rows, precision)
            self._projections[key] = (ranked, rows)
        return self._projections[key]

    def read_features(self, embedded: Tensor, features: Tensor) -> Tensor:
        """embedded: (..., M) tokens at their positions; features: (..., M) parent states."""
        x = torch.cat([embedded, features.to(embedded.dtype)], dim=-1)
        return project(x, self.feature_proj)

    def fuse_features(self, features: Tensor) -> Tensor:
        """features: (..., (L + 1) M) the target's states of `feature_layers`, then its
        final state -> (..., M), what the head reads as a parent's state."""
        if self.fuse is None:
            return features
        return project(features.to(self.fuse.weight.dtype), self.fuse)

    def own_state_dict(self) -> dict[str, Tensor]:
        """The head's own weights: what a checkpoint stores (the rest is the target's)."""
        return {k: v for k, v in self.state_dict().items() if k.startswith(_OWN)}

    def own_parameters(self) -> list[nn.Parameter]:
        return [p for k, p in self.named_parameters() if k.startswith(_OWN)]

    def cast(self, dtype: torch.dtype) -> DraftHead:
        """The head's own weights in `dtype`. The target's shared front-end, final norm
        and projection are copied in that type, never cast: verification stays fp32."""
        self.feature_proj.to(dtype)
        if self.fuse is not None:
            self.fuse.to(dtype)
        self.decoder.layers.to(dtype)
        self._projections.clear()
        if self.decoder.layer_norm is not None and self.decoder.layer_norm.weight.dtype != dtype:
            # One deepcopy keeps the tied embedding and projection one tensor.
            frontend, proj, norm = copy.deepcopy(
                (self.decoder_frontend, quant.plain(self.final_proj), self.decoder.layer_norm)
            )
            self.decoder_frontend, self.final_proj = frontend.to(dtype), proj.to(dtype)
            self.decoder.layer_norm = norm.to(dtype)
        return self

    def quantize(self, precision: str) -> DraftHead:
        """The head's products in `precision` (`specbeam.kernels.quant`), its fp32 weights
        kept: its own layers, and a copy of the target's projection (verification runs
        the target's own in the target's precision)."""
        quant.quantize(self.decoder.layers, precision)
        self.feature_proj = quant.QuantizedLinear(quant.plain(self.feature_proj), precision)
        if self.fuse is not None:
            self.fuse = quant.QuantizedLinear(quant.plain(self.fuse), precision)
        self.decoder_frontend, proj = copy.deepcopy(
            (self.decoder_frontend, quant.plain(self.final_proj))
        )
        self.final_proj = quant.QuantizedLinear(proj, precision)
        self._projections.clear()
        return self

    def checkpoint(self) -> dict[str, Any]:
        ckpt = {"kind": HEAD_KIND, "arch": asdict(self.arch), "model": self.own_state_dict()}
        if self.vocab is not None:
            ckpt["vocab"] = self.vocab
        return ckpt


def load_head(ckpt: Mapping[str, Any], target: TransformerModel) -> DraftHead:
    """A head from `DraftHead.checkpoint()` over `target`, in the target's data type."""
    arch = stored_settings(HeadArch, ckpt["arch"], "arch")
    head = DraftHead(target, replace(arch, feature_layers=tuple(arch.feature_layers)))
    own = {k: v.to(next(target.parameters()).dtype) for k, v in ckpt["model"].items()}
    expected = set(head.own_state_dict())
    if set(own) != expected:
        missing, unexpected = sorted(expected - set(own)), sorted(set(own) - expected)
        raise ValueError(
            f"checkpoint does not fit a head over this target (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    head.load_state_dict(own, strict=False)
    vocab = ckpt.get("vocab")
    head.vocab = None if vocab is None else vocab.long()
    return head.eval()
