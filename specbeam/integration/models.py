"""Builds NLLB-architecture fairseq2 models from small arch configs and saves/loads them."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, final

import torch
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.data.tokenizers.sentencepiece import SentencePieceModel
from fairseq2.models.nllb import NllbConfig, NllbFactory, create_nllb_model
from fairseq2.models.transformer import (
    IdentityBias,
    MultiheadAttention,
    StandardMultiheadAttention,
    TransformerModel,
    create_default_sdpa,
)

from specbeam.paths import REPO_ROOT
from specbeam.search.head import HEAD_KIND, DraftHead, load_head

Draft = TransformerModel | DraftHead
"""A draft model: a decoder of its own, or a head over the target's states."""


@dataclass(kw_only=True)
class ModelArch:
    """The size of an NLLB-architecture model; everything else is NLLB's default."""

    model_dim: int = 512
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    num_attn_heads: int = 8
    ffn_inner_dim: int = 2048
    dropout_p: float = 0.1
    vocab_size: int = 8000
    pad_idx: int = 0
    max_seq_len: int = 1024

    def to_nllb_config(self) -> NllbConfig:
        return NllbConfig(
            model_dim=self.model_dim,
            max_seq_len=self.max_seq_len,
            vocab_size=self.vocab_size,
            pad_idx=self.pad_idx,
            num_encoder_layers=self.num_encoder_layers,
            num_decoder_layers=self.num_decoder_layers,
            num_encoder_attn_heads=self.num_attn_heads,
            num_decoder_attn_heads=self.num_attn_heads,
            ffn_inner_dim=self.ffn_inner_dim,
            dropout_p=self.dropout_p,
        )


def build_model(arch: ModelArch) -> TransformerModel:
    return create_nllb_model(arch.to_nllb_config())


@final
class _ShallowDraftFactory(NllbFactory):
    """NLLB layers of the draft's size whose cross-attention reads wider encoder states."""

    def __init__(self, config: NllbConfig, encoder_dim: int) -> None:
        super().__init__(config)
        self._encoder_dim = encoder_dim

    def create_encoder_decoder_attention(self) -> MultiheadAttention:
        sdpa = create_default_sdpa(IdentityBias())
        heads = self._config.num_decoder_attn_heads
        return StandardMultiheadAttention(
            self._config.model_dim, heads, sdpa, kv_dim=self._encoder_dim
        )


def build_shallow_draft(target: TransformerModel, arch: ModelArch) -> TransformerModel:
    """A draft decoder (of `arch`'s size) over the target's own encoder: the encoder
    modules are shared, so the draft never encodes and needs no encoder weights."""
    config = arch.to_nllb_config()
    factory = _ShallowDraftFactory(config, target.model_dim)
    embed = factory.create_embedding()
    return TransformerModel(
        config.model_dim, target.encoder_frontend, target.encoder, factory.create_frontend(embed),
        factory.create_decoder(), factory.create_final_projection(embed), config.pad_idx,
        config.max_seq_len, config.max_seq_len,
    )  # fmt: skip


def cast_draft(draft: Draft, target: TransformerModel, dtype: torch.dtype) -> Draft:
    """Casts the draft's own modules; an encoder it shares with the target keeps the
    target's precision (verification must stay fp32)."""
    if isinstance(draft, DraftHead):
        return draft.cast(dtype)
    if draft.encoder is not target.encoder:
        draft.encoder_frontend.to(dtype)
        draft.encoder.to(dtype)
    for module in (draft.decoder_frontend, draft.decoder, draft.final_proj):
        module.to(dtype)
    return draft


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def atomic_save(obj: Any, path: Path) -> None:
    """A killed writer never leaves a truncated checkpoint behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


_ENCODER_KEYS = ("encoder_frontend.", "encoder.")


def save_model(
    model: TransformerModel,
    arch: ModelArch,
    path: Path,
    dtype: torch.dtype,
    *,
    shares_encoder: bool = False,
) -> None:
    """A draft that shares its target's encoder is saved without it. Tied weights (the
    embeddings and the output projection) stay one tensor, so they are stored once."""
    converted: dict[int, torch.Tensor] = {}
    state = {}
    for k, v in model.state_dict().items():
        if shares_encoder and k.startswith(_ENCODER_KEYS):
            continue
        if v.data_ptr() not in converted:
            converted[v.data_ptr()] = v.to(dtype)
        state[k] = converted[v.data_ptr()]
    atomic_save({"arch": asdict(arch), "shares_encoder": shares_encoder, "model": state}, path)


def save_head(head: DraftHead, path: Path, dtype: torch.dtype) -> None:
    """The head's own weights only; the target's modules it reads come with the target."""
    ckpt = head.checkpoint()
    ckpt["model"] = {k: v.to(dtype) for k, v in ckpt["model"].items()}
    atomic_save(ckpt, path)


def load_model(
    path: Path, dtype: torch.dtype = torch.float32, *, target: TransformerModel | None = None
) -> Any:
    """Loads a checkpoint of `save_model` (a `TransformerModel`) or `save_head` (a
    `DraftHead`); a draft saved without its encoder, and any head, is rebuilt over
    `target` (whose modules keep their precision)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if ckpt.get("kind") == HEAD_KIND:
        if target is None:
            raise ValueError(f"{path} is a draft head: load it as part of a model pair")
        try:
            return load_head(ckpt, target).cast(dtype)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
    arch = ModelArch(**ckpt["arch"])
    if not ckpt.get("shares_encoder", False):
        model = build_model(arch)
        model.load_state_dict(ckpt["model"])
        return model.to(dtype).eval()
    if target is None:
        raise ValueError(
            f"{path} is a draft decoder over its target's encoder: load it as part of a model pair"
        )
    model = build_shallow_draft(target, arch)
    missing, unexpected = model.load_state_dict(ckpt["model"], strict=False)
    if unexpected or any(not k.startswith(_ENCODER_KEYS) for k in missing):
        raise ValueError(
            f"{path} does not fit a draft over this target (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return cast_draft(model, target, dtype).eval()


@dataclass(kw_only=True)
class ModelPairConfig:
    """A target and its draft, by checkpoint path (relative to the repository), or
    "random" for untrained models of `random_arch` sizes (pipeline checks only)."""

    name: str = "bible_es_en"
    target: str = "tasks/bible_es_en/models/target.pt"
    draft: str | None = "tasks/bible_es_en/models/head.pt"
    random_target_arch: ModelArch | None = None
    random_draft_arch: ModelArch | None = None


def load_pair(
    cfg: ModelPairConfig,
    vocab_size: int,
    *,
    with_draft: bool,
    draft_dtype: torch.dtype = torch.float32,
    root: Path = REPO_ROOT,
) -> tuple[TransformerModel, Draft | None]:
    """Loads the target, and the draft when a speculative method will run."""
    target = _load_one(cfg.target, cfg.random_target_arch, root, vocab_size, seed=0)
    assert isinstance(target, TransformerModel)  # a head cannot load without one
    draft = None
    if with_draft:
        if cfg.draft is None:
            raise ValueError(f"model={cfg.name} has no draft, but a speculative decoding needs one")
        draft = cast_draft(
            _load_one(cfg.draft, cfg.random_draft_arch, root, vocab_size, seed=1, target=target),
            target,
            draft_dtype,
        )
        check_same_vocabulary(target, draft)
    return target, draft


def _load_one(
    spec: str,
    arch: ModelArch | None,
    root: Path,
    vocab_size: int,
    seed: int,
    target: TransformerModel | None = None,
) -> Draft:
    if spec == "random":
        if arch is None:
            raise ValueError("model: 'random' needs random_target_arch / random_draft_arch")
        torch.manual_seed(seed)
        arch = ModelArch(**{**asdict(arch), "vocab_size": vocab_size})
        return build_model(arch).eval()
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else root / path
    if not path.exists():
        raise FileNotFoundError(
            f"model checkpoint not found: {path} (tasks/bible_es_en/README.md says how to build "
            "the embedded pair; model=tiny_random runs the pipeline with untrained models)"
        )
    return load_model(path, target=target)


def check_same_vocabulary(target: TransformerModel, draft: Draft) -> None:
    t, d = target.final_proj.output_dim, draft.final_proj.output_dim
    if t != d:
        raise ValueError(f"draft vocabulary ({d} entries) differs from the target's ({t} entries)")
    if target.pad_idx != draft.pad_idx:
        raise ValueError(
            f"draft pad index {draft.pad_idx} differs from the target's {target.pad_idx}"
        )


def tokenizer_pieces(tokenizer: Tokenizer) -> list[str] | None:
    """The pieces of the SentencePiece model behind a fairseq2 tokenizer (NLLB, and
    fairseq2's other SentencePiece tokenizers keep it as `_model`); None for others."""
    model = getattr(tokenizer, "_model", None)
    if not isinstance(model, SentencePieceModel):
        return None
    return [model.index_to_token(i) for i in range(model.vocabulary_size)]


def check_same_pieces(target: Tokenizer, draft: Tokenizer) -> None:
    """Same sizes and special indices can still hide different vocabularies; where both
    tokenizers are SentencePiece models, every piece must match."""
    ours, theirs = tokenizer_pieces(target), tokenizer_pieces(draft)
    if ours is None or theirs is None:
        return
    if len(ours) != len(theirs):
        raise ValueError(f"draft tokenizer has {len(theirs)} pieces, the target's has {len(ours)}")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a != b:
            raise ValueError(
                f"draft tokenizer piece {i} is {b!r} where the target's is {a!r}: "
                "the two models do not share a vocabulary"
            )
