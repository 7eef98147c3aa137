"""Runs a fairseq2 encoder-decoder over trees of new tokens, one source per batch row.

Nothing in fairseq2 is patched: the decoder's self-attention layers get a `TorchSDPA`
whose `AttentionBias` returns our tree mask, their incremental states are our
speculative cache views, and decoder inputs are embedded with explicit positions
(fairseq2's position encoder assumes `step_nr + arange`, wrong for tree depth and for
rows of different lengths).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import final

import torch
from fairseq2.error import NotSupportedError
from fairseq2.models.transformer import (
    AttentionBias,
    StandardTransformerEncoder,
    TorchSDPA,
    TransformerDecoder,
    TransformerEmbeddingFrontend,
    TransformerModel,
)
from fairseq2.nn import (
    BatchLayout,
    IncrementalStateBag,
    Linear,
    SinusoidalPositionEncoder,
    StandardEmbedding,
    TiedProjection,
)
from torch import Tensor
from typing_extensions import override

from specbeam.kernels import attention, native
from specbeam.kernels.lean_decoder import (
    LeanDecoder,
    Packing,
    cross_keys,
    lean_problem,
    padding_bias,
)
from specbeam.kernels.lean_encoder import MAX_TOKENS, encode, encoder_problem
from specbeam.kernels.onednn import project
from specbeam.kernels.quant import plain
from specbeam.kernels.states import CrossAttentionState
from specbeam.search.cache import SpeculativeKVCache
from specbeam.search.head import DraftHead
from specbeam.search.peak_cache import observe

log = logging.getLogger(__name__)


def tree_bias(lens: Tensor, k: int, column: Tensor, visible: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive self-attention mask (S, 1, T, width·k + slots): slot t of source s sees
    position c of the cached prefix in column column[s, t, c] (positions c < lens[s] of the
    width, columns interleaved position-major as in the cache) and the slots `visible`
    (S, T, slots) says. Compiled where `native` is built and runs (the same ops)."""
    ext = native.module_for(column)
    if ext is not None:
        return ext.tree_bias(lens, k, column, visible, dtype)
    width = column.size(2)
    cached = torch.arange(width, device=column.device)[None, :] < lens[:, None]  # (S, W)
    own = column[..., None] == torch.arange(k, device=column.device)  # (S, T, W, k)
    prefix = cached[:, None, :, None] & own
    mask = torch.cat([prefix.flatten(2), visible], dim=2)
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return bias.masked_fill_(~mask, -torch.inf)[:, None]


def embed_at(frontend: TransformerEmbeddingFrontend, tokens: Tensor, positions: Tensor) -> Tensor:
    """fairseq2's embedding front-end with explicit positions, in fp32 (...) -> (..., M).
    Compiled for inference where `native` is built and runs (the same ops)."""
    pos = frontend.pos_encoder
    assert isinstance(pos, SinusoidalPositionEncoder)
    ext = native.module_for(tokens)
    if (
        ext is not None
        and type(frontend.embed) is StandardEmbedding
        and not torch.is_grad_enabled()
    ):
        weight = frontend.embed.weight
        return ext.embed(weight, tokens, positions, pos.freqs, frontend.scale, pos.max_seq_len)
    x = frontend.embed(tokens)
    if frontend.scale != 1.0:
        x = x * frontend.scale
    return x.float() + pos.freqs[1 + positions.clamp(0, pos.max_seq_len - 1)]


@final
class TreeBias(AttentionBias):
    """Hands the current call's additive mask (S, 1, T, keys) to SDPA."""

    def __init__(self) -> None:
        self.tensor: Tensor | None = None

    @override
    def create_bias_tensor(self, q_len: int, k_len: int, device, dtype) -> Tensor:  # noqa: ANN001
        if self.tensor is None or self.tensor.shape[-2:] != (q_len, k_len):
            raise RuntimeError("tree bias was not prepared for this decoder call")
        return self.tensor.to(dtype)


@final
class TreeDecoder:
    """One model's decoder with a speculative cache, over S sources with k hypotheses each."""

    @staticmethod
    def pair(
        target: TransformerModel,
        draft: TransformerModel | DraftHead,
        source_seqs: Tensor,
        source_layout: BatchLayout,
        *,
        hyps_per_source: int,
        capacity: int,
        capacity_increment: int | None = None,
        lean_draft: bool = False,
        lean_target: bool = False,
    ) -> tuple[TreeDecoder, TreeDecoder]:
        """The target's and the draft's decoders; a draft over the target's encoder
        reads the target's encoder output, so each source is encoded once. With
        `lean_draft` / `lean_target`, that model runs as plain tensor ops where it can
        (lean_decoder.py)."""
        first = TreeDecoder(
            target, source_seqs, source_layout, hyps_per_source=hyps_per_source,
            capacity=capacity, capacity_increment=capacity_increment, lean=lean_target,
            taps=draft.feature_layers if isinstance(draft, DraftHead) else (),
        )  # fmt: skip
        shared = draft.encoder is target.encoder
        second = TreeDecoder(
            draft, source_seqs, source_layout, hyps_per_source=hyps_per_source, capacity=capacity,
            capacity_increment=capacity_increment,
            encoder_output=first.encoder_output if shared else None, lean=lean_draft,
        )  # fmt: skip
        return first, second

    def __init__(
        self,
        model: TransformerModel | DraftHead,
        source_seqs: Tensor,
        source_layout: BatchLayout,
        *,
        hyps_per_source: int,
        capacity: int,
        capacity_increment: int | None = None,
        encoder_output: Tensor | None = None,
        lean: bool = False,
        taps: tuple[int, ...] = (),
    ) -> None:
        """`capacity` positions per hypothesis at most, allocated `capacity_increment` at
        a time (None: all at once). `encoder_output` skips encoding: a draft that reads
        its target's encoder output gets it from the target's decoder (`pair`). `lean`
        runs the encoder and decoder as plain tensor ops if their layers allow (else as
        fairseq2's). `taps`: decoder layers whose outputs `features` returns beside the
        final states (a draft head's over several layers)."""
        frontend = model.decoder_frontend
        if not isinstance(frontend, TransformerEmbeddingFrontend) or not isinstance(
            frontend.pos_encoder, SinusoidalPositionEncoder
        ):
            raise NotSupportedError(
                "specbeam needs a decoder front-end with token embeddings and sinusoidal positions"
            )
        self.model = model
        self.taps = taps
        self.tapped: list[Tensor] = []  # the last call's outputs of layers `taps`
        self.head = model if isinstance(model, DraftHead) else None
        self.dtype = dtype = next(model.decoder.parameters()).dtype
        self.bias = TreeBias()
        self._tree_sdpas = [
            attention.ordered(TorchSDPA(self.bias), layer.self_attn.sdpa)
            for layer in model.decoder.layers
        ]
        if encoder_output is None:
            encoder_output = _encode(model, source_seqs, source_layout, lean)
        self.encoder_output = encoder_output.to(dtype)
        self.encoder_seq_lens = list(source_layout.seq_lens)
        layers = list(model.decoder.layers)
        attn = layers[0].self_attn
        self.cache = SpeculativeKVCache(
            len(layers), source_seqs.size(0), capacity, hyps_per_source,
            attn.num_key_value_heads, attn.head_dim, device=source_seqs.device, dtype=dtype,
            increment=capacity_increment,
        )  # fmt: skip
        self.state_bag = IncrementalStateBag(capacity)
        own = [self.cache.layer_state(i) for i in range(len(layers))]
        cross = [self._cross_state(layer) for layer in layers]
        for layer, own_state, cross_state in zip(layers, own, cross, strict=True):
            self.state_bag.set_state(layer.self_attn, own_state)
            self.state_bag.set_state(layer.encoder_decoder_attn, cross_state)
        self.lean: LeanDecoder | None = None
        problem = lean_problem(model.decoder) if lean else None
        if problem is not None:
            log.info("%s's decoder runs through fairseq2's modules: %s", _name(model), problem)
        elif lean:
            self.lean = LeanDecoder(model.decoder, own, cross)
        self._source_bias = self._padding_bias()

    def _padding_bias(self) -> Tensor | None:
        """The lean path's cross-attention mask (fairseq2's path derives its own)."""
        if self.lean is None:
            return None
        enc = self.encoder_output
        return padding_bias(self.encoder_seq_lens, enc.size(1), self.dtype, enc.device)

    def _cross_state(self, layer: torch.nn.Module) -> CrossAttentionState:
        attn = layer.encoder_decoder_attn
        if attn.k_norm is not None or attn.v_norm is not None or attn.pos_encoder is not None:
            raise NotSupportedError("cross-attention with key norms or positions is not supported")
        return CrossAttentionState(*cross_keys(attn, self.encoder_output))

    @contextmanager
    def _tree_attention(self) -> Iterator[None]:
        """Installs the tree mask in the decoder's self-attention for one call, so the
        model is untouched between calls (and may even serve as its own draft)."""
        layers = self.model.decoder.layers
        saved = [layer.self_attn.sdpa for layer in layers]
        try:
            for layer, sdpa in zip(layers, self._tree_sdpas, strict=True):
                layer.self_attn.sdpa = sdpa
            yield
        finally:
            for layer, sdpa in zip(layers, saved, strict=True):
                layer.self_attn.sdpa = sdpa

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        return embed_at(self.model.decoder_frontend, tokens, positions).to(self.dtype)

    def features(self, hidden: Tensor) -> Tensor:
        """The last call's states a draft head reads, (S, T, (len(taps) + 1) M): the
        outputs of layers `taps`, then `hidden`, its final states."""
        return torch.cat([*self.tapped, hidden], dim=-1) if self.tapped else hidden

    def packing(self, valid: Tensor) -> Packing | None:
        """How `forward` should pack slots `valid` (S, T): only the lean path packs."""
        return None if self.lean is None else Packing.of(valid)

    @property
    def reads_features(self) -> bool:
        """A draft head: every slot also reads its parent's (target) decoder state."""
        return self.head is not None

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        hyp: Tensor,
        visible: Tensor,
        features: Tensor | None = None,
        packing: Packing | None = None,
    ) -> Tensor:
        """Decodes T new slots per source; returns their decoder outputs (S, T, M).

        tokens, positions, hyp: (S, T); visible: (S, T, spec_len + T) over the slots
        already in the cache after the last commit, then these. features: (S, T, M), the
        parents' states, for a draft head only. With `packing` the lean path computes the
        valid slots only; the outputs of the others are zeros.
        """
        if (features is not None) != self.reads_features:
            raise ValueError("a draft head needs its parents' states; other decoders take none")
        cache = self.cache
        cache.reserve(tokens.size(1))
        column = cache.prefix_columns(hyp)
        self.bias.tensor = tree_bias(cache.lens, cache.k, column, visible, self.dtype)
        x = self.embed(tokens, positions)
        if self.head is not None:
            assert features is not None
            x = self.head.read_features(x, features)
        if self.lean is not None:
            out, tapped = self.lean(x, self.bias.tensor, self._source_bias, self.taps, packing)
            if packing is not None:
                out, tapped = packing.unpack(out), [packing.unpack(t) for t in tapped]
            observe(self.model.decoder, self.state_bag)
        else:
            enc_layout = BatchLayout.of(self.encoder_output, self.encoder_seq_lens)
            with self._tree_attention(), tapping(self.model.decoder, self.taps) as tapped:
                out = self.model.decoder(
                    x, BatchLayout.of(x), self.encoder_output, enc_layout, state_bag=self.state_bag
                )
        self.tapped = tapped
        cache.advance(tokens.size(1))
        self.bias.tensor = None
        return out

    def logits(self, hidden: Tensor, packing: Packing | None = None) -> Tensor:
        """Projects decoder outputs (..., M) to vocabulary logits (..., V); with `packing`
        (lean path only), the valid slots only, zeros elsewhere."""
        proj = self.model.final_proj
        if self.lean is not None and isinstance(plain(proj), Linear | TiedProjection):
            if packing is None:
                return project(hidden, proj)
            return packing.unpack(project(packing.pack(hidden), proj))
        return proj(hidden)

    def select_sources(self, keep: Tensor) -> None:
        self.cache.select_sources(keep)
        self.encoder_output = self.encoder_output.index_select(0, keep)
        self.encoder_seq_lens = [self.encoder_seq_lens[i] for i in keep.tolist()]
        self._source_bias = self._padding_bias()
        for layer in self.model.decoder.layers:
            state = self.state_bag.maybe_get_state(layer.encoder_decoder_attn, CrossAttentionState)
            state.reorder(keep)


@contextmanager
def tapping(decoder: TransformerDecoder, taps: Sequence[int]) -> Iterator[list[Tensor]]:
    """The outputs of layers `taps` of fairseq2's decoder, collected while in the block."""
    tapped: list[Tensor] = []
    hooks = [
        decoder.layers[i].register_forward_hook(lambda _m, _a, out: tapped.append(out))
        for i in taps
    ]
    try:
        yield tapped
    finally:
        for hook in hooks:
            hook.remove()


def _encode(
    model: TransformerModel | DraftHead, source_seqs: Tensor, source_layout: BatchLayout, lean: bool
) -> Tensor:
    encoded, layout = model.encoder_frontend(source_seqs, source_layout)
    lean = lean and source_seqs.numel() <= MAX_TOKENS and not model.encoder.training
    problem = encoder_problem(model.encoder) if lean else None
    if problem is None and lean:
        assert isinstance(model.encoder, StandardTransformerEncoder)
        return encode(model.encoder, encoded, list(layout.seq_lens))
    if problem is not None:
        log.info("%s's encoder runs through fairseq2's modules: %s", _name(model), problem)
    return model.encoder(encoded, layout)


def _name(model: torch.nn.Module) -> str:
    """The model's class and size, to tell target and draft apart in the log."""
    size = sum(p.numel() for p in model.parameters())
    return f"{type(model).__name__} ({size / 1e6:.1f} M parameters)"
