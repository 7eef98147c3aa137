"""Builds NLLB-architecture fairseq2 models from small arch configs and saves/loads them."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, final

import torch
from fairseq2.assets import AssetStore
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

from specbeam.integration.hub import (
    asset_store,
    check_checkpoint,
    check_language,
    is_path,
    load_card_model,
    load_card_tokenizer,
    own_draft_path,
    retrieve_card,
)
from specbeam.paths import SHIPPED, user_path
from specbeam.search.checks import check_same_vocabulary
from specbeam.search.head import HEAD_KIND, DraftHead, load_head
from specbeam.search.stored import stored_settings

log = logging.getLogger("specbeam.models")

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

    @classmethod
    def stored(cls, arch: object, path: Path) -> ModelArch:
        """The `arch` a checkpoint at `path` stores; one that is not a `ModelArch` (another
        tool's, or a newer specbeam's) is a one-line error naming the file."""
        try:
            return stored_settings(cls, arch, "arch")
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    @classmethod
    def of_nllb(cls, config: NllbConfig) -> ModelArch:
        """An NLLB config (e.g. a registered architecture's) as a `ModelArch`; its encoder
        and decoder must have as many attention heads."""
        if config.num_encoder_attn_heads != config.num_decoder_attn_heads:
            raise ValueError("a ModelArch has as many encoder as decoder attention heads")
        return cls(
            model_dim=config.model_dim, num_encoder_layers=config.num_encoder_layers,
            num_decoder_layers=config.num_decoder_layers,
            num_attn_heads=config.num_encoder_attn_heads, ffn_inner_dim=config.ffn_inner_dim,
            dropout_p=config.dropout_p, vocab_size=config.vocab_size, pad_idx=config.pad_idx,
            max_seq_len=config.max_seq_len,
        )  # fmt: skip

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
    """The head's own weights only; the target's modules it reads come with the target,
    so the target's fingerprint is stored to refuse any other at load time."""
    ckpt = head.checkpoint()
    ckpt["model"] = {k: v.to(dtype) for k, v in ckpt["model"].items()}
    ckpt["target"] = target_fingerprint(head)
    atomic_save(ckpt, path)


class HeadTargetMismatch(ValueError):
    """A draft head loaded over a target other than the one it was trained over."""


_SAMPLES = 16
_FINGERPRINT_TOL = 0.01


def target_fingerprint(model: TransformerModel | DraftHead) -> dict[str, Any]:
    """What identifies a target: its sizes, and the root mean square and a few sampled
    values of the weights a head reads from it (output projection, encoder). A head
    exposes the same modules as its target, so it has the same fingerprint."""
    encoder = list(model.encoder.named_parameters())
    weights = {"final_proj": model.final_proj.weight}
    weights |= {f"encoder.{name}": p for name, p in (encoder[0], encoder[-1])}
    stats = {}
    for name, weight in weights.items():
        flat = weight.detach().flatten()  # not copied to float64 whole: only the sums are
        picks = torch.linspace(0, flat.numel() - 1, _SAMPLES).long()
        rms = float(torch.linalg.vector_norm(flat, dtype=torch.float64)) / math.sqrt(flat.numel())
        stats[name] = [rms, *flat[picks].double().tolist()]
    config = {
        "model_dim": model.model_dim,
        "vocab_size": model.final_proj.output_dim,
        "pad_idx": model.pad_idx,
        "encoder_layers": len(model.encoder.layers),
        "max_target_seq_len": model.max_target_seq_len,
    }
    return {"config": config, "weights": stats}


def same_target(stored: dict[str, Any], actual: dict[str, Any]) -> bool:
    """Equal sizes, and weights equal up to a cast (bf16 rounds by 0.4 % at most)."""
    if stored["config"] != actual["config"] or stored["weights"].keys() != actual["weights"].keys():
        return False
    for name, (rms, *values) in actual["weights"].items():
        for a, b in zip(stored["weights"][name][1:], values, strict=True):
            if abs(a - b) > _FINGERPRINT_TOL * (abs(b) + rms):
                return False
    return True


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    """A short name for a fingerprint, for messages."""
    rounded = json.dumps(fingerprint, sort_keys=True, default=lambda x: f"{x:.2g}")
    return hashlib.sha256(rounded.encode()).hexdigest()[:12]


def read_checkpoint(path: Path, hint: str) -> dict:
    """A specbeam checkpoint, read without unpickling code (`weights_only`); anything
    else is a one-line error naming the file (`hint`: what to do instead)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a file that is not its own
        raise ValueError(unreadable_checkpoint(path, error)) from None
    if not isinstance(ckpt, dict) or "arch" not in ckpt:
        raise ValueError(f"{path} is not a specbeam checkpoint (no `arch`): {hint}")
    return ckpt


def unreadable_checkpoint(path: Path, error: Exception) -> str:
    """Why torch could not read `path`: a zip archive it cannot open is a checkpoint cut
    short (a copy or a save interrupted); objects that need unpickling code are refused as
    they would run code; anything else is no checkpoint."""
    with open(path, "rb") as f:
        zipped = f.read(4) == b"PK\x03\x04"  # torch.save's format since torch 1.6
    if not zipped:
        return f"{path} is not a checkpoint: not a file torch.save wrote"
    if "Weights only load failed" in str(error):
        return (
            f"{path} holds Python objects beside its tensors, which specbeam does not load "
            "(unpickling them would run their code)"
        )
    return f"{path} is truncated or corrupt: torch cannot read its archive; copy or save it again"


OTHER_CHECKPOINTS = (
    "a path is for what specbeam.train and specbeam.train_head write; another fairseq2 "
    "model goes by its asset card (model.asset_dirs=[DIR] model.target=NAME; README, "
    '"Your own model")'
)


def load_model(
    path: Path, dtype: torch.dtype = torch.float32, *, target: TransformerModel | None = None
) -> Any:
    """Loads a checkpoint of `save_model` (a `TransformerModel`) or `save_head` (a
    `DraftHead`); a draft saved without its encoder, and any head, is rebuilt over
    `target` (whose modules keep their precision)."""
    ckpt = read_checkpoint(path, OTHER_CHECKPOINTS)
    if ckpt.get("kind") == HEAD_KIND:
        if target is None:
            raise ValueError(f"{path} is a draft head: load it as part of a model pair")
        stored, actual = ckpt.get("target"), target_fingerprint(target)
        if stored is not None and not same_target(stored, actual):
            raise HeadTargetMismatch(
                f"{path} stores target fingerprint {fingerprint_digest(stored)}, this "
                f"target's is {fingerprint_digest(actual)}"
            )
        try:
            return load_head(ckpt, target).cast(dtype)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        except RuntimeError:  # a head saved without a fingerprint, over another size
            raise HeadTargetMismatch(
                f"{path} has weights of another size than this target's"
            ) from None
    arch = ModelArch.stored(ckpt["arch"], path)
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
class TargetConfig:
    """A target model by asset card name or checkpoint path (relative to the working
    directory unless absolute); its tokenizer is its card's."""

    target: str = "bible_es_en_target"
    """The target model, by asset card name or checkpoint path (`save_model`'s; relative to
    the working directory unless absolute); a pair's may be "random" (`random_target_arch`)."""
    tokenizer: str | None = None
    """The card whose tokenizer to use; None: the target's card (a target given as a
    checkpoint path or "random" needs one)."""
    asset_dirs: list[str] = field(default_factory=list)
    """Directories of asset cards (relative to the working directory unless absolute), besides
    fairseq2's, FAIRSEQ2_USER_ASSET_DIR's and the embedded tasks'."""

    def tokenizer_card(self) -> str:
        if self.tokenizer is not None:
            return self.tokenizer
        if is_path(self.target):
            _checkpoint("model.target", self.target)  # a missing file first: it is the problem
        if self.target == "random" or is_path(self.target):
            raise ValueError(
                f"model.target={self.target} is not an asset card, so it names no tokenizer: "
                "set model.tokenizer to the card whose tokenizer the target uses"
            )
        return self.target

    def load_tokenizer(self, store: AssetStore | None = None) -> Tokenizer:
        """The tokenizer of `tokenizer`'s card, else of the target's."""
        setting = "model.tokenizer" if self.tokenizer is not None else "model.target"
        store = store or asset_store(self.asset_dirs)
        return load_card_tokenizer(store, setting, self.tokenizer_card())


@dataclass(kw_only=True)
class ModelPairConfig(TargetConfig):
    """A target and its draft, each by asset card name or checkpoint path, or "random"
    for untrained models of `random_arch` sizes (pipeline checks only)."""

    name: str = "bible_es_en"
    """The pair's name, that of its file (conf/model/<name>.yaml); a label for messages."""
    draft: str | None = "bible_es_en_head"
    """None (or "none"): no draft; only plain decodings run."""
    random_target_arch: ModelArch | None = None
    """The sizes (`ModelArch`) of the untrained target `target=random` builds; its
    vocabulary is the tokenizer's."""
    random_draft_arch: ModelArch | None = None
    """The sizes (`ModelArch`) of the untrained draft model `draft=random` builds; its
    vocabulary is the tokenizer's."""

    def __post_init__(self) -> None:
        if self.draft is not None and self.draft.lower() == "none":
            self.draft = None


@dataclass
class LoadedPair:
    tokenizer: Tokenizer
    target: TransformerModel
    draft: Draft | None


def open_pair(
    cfg: ModelPairConfig,
    src_lang: str,
    tgt_lang: str,
    *,
    with_draft: bool,
    draft_dtype: torch.dtype = torch.float32,
) -> LoadedPair:
    """The tokenizer (which must know both languages), the target, and the draft when a
    speculative method will run."""
    store = asset_store(cfg.asset_dirs)
    if cfg.target != "random" and not is_path(cfg.target):
        check_checkpoint(retrieve_card(store, "model.target", cfg.target), "model.target")
    card = cfg.tokenizer_card()
    tokenizer = cfg.load_tokenizer(store)
    check_language(tokenizer, "task.src_lang", src_lang, "source", card)
    check_language(tokenizer, "task.tgt_lang", tgt_lang, "target", card)
    target, draft = load_pair(
        cfg, tokenizer.vocab_info.size, with_draft=with_draft, draft_dtype=draft_dtype, store=store
    )
    if draft is not None and cfg.draft != "random" and not is_path(cfg.draft or ""):
        # A draft card that names its tokenizer must use the target's pieces.
        draft_card = retrieve_card(store, "model.draft", cfg.draft or "")
        if any(draft_card.maybe_get_field(f) is not None for f in ("tokenizer", "tokenizer_ref")):
            draft_tokenizer = load_card_tokenizer(store, "model.draft", draft_card.name)
            try:
                check_same_pieces(tokenizer, draft_tokenizer)
            except ValueError as error:
                raise ValueError(
                    f"model.draft={cfg.draft} does not fit model.target={cfg.target}: {error}"
                ) from None
    return LoadedPair(tokenizer, target, draft)


def load_pair(
    cfg: ModelPairConfig,
    vocab_size: int,
    *,
    with_draft: bool,
    draft_dtype: torch.dtype = torch.float32,
    store: AssetStore | None = None,
) -> tuple[TransformerModel, Draft | None]:
    """Loads the target, and the draft when a speculative method will run."""
    store = store or asset_store(cfg.asset_dirs)
    if cfg.target == "random":
        target = _random_model("model.target", cfg.random_target_arch, vocab_size, seed=0)
    else:
        target = load_target(cfg.target, store)
    if not with_draft:
        return target, None
    if cfg.draft is None:
        raise ValueError(f"model={cfg.name} has no draft, but a speculative decoding needs one")
    if cfg.draft == "random":
        draft: Draft = _random_model("model.draft", cfg.random_draft_arch, vocab_size, seed=1)
    else:
        draft = load_draft(cfg.draft, target, store, target_spec=cfg.target)
        if is_target_itself(draft, target):
            log.warning(
                "model.draft=%s is model.target=%s itself: each draft call costs a target "
                "call, so speculation runs slower than plain search; name a smaller draft, "
                "or use a non-speculative decoding (beam, greedy)",
                cfg.draft, cfg.target,
            )  # fmt: skip
    return target, cast_draft(draft, target, draft_dtype)


def is_target_itself(draft: Draft, target: TransformerModel) -> bool:
    """Whether a draft is the target's weights (named by another card or path): a decoder
    of the same shapes whose first and last weights equal the target's."""
    ours, theirs = list(draft.decoder.parameters()), list(target.decoder.parameters())
    if [p.shape for p in ours] != [p.shape for p in theirs]:
        return False
    return all(torch.equal(ours[i], theirs[i]) for i in (0, -1))


def _random_model(setting: str, arch: ModelArch | None, vocab_size: int, seed: int) -> Any:
    if arch is None:
        raise ValueError(f"{setting}=random needs random_target_arch / random_draft_arch")
    torch.manual_seed(seed)
    return build_model(ModelArch(**{**asdict(arch), "vocab_size": vocab_size})).eval()


def _checkpoint(setting: str, spec: str) -> Path:
    """A checkpoint path that exists; a missing one of the embedded task's says how to build
    it, a user's own is named alone."""
    path = user_path(spec)
    if not path.exists():
        embedded = path.resolve().is_relative_to((SHIPPED / "tasks").resolve())
        hint = (
            " (tasks/bible_es_en/README.md says how to build the embedded pair; "
            "model=tiny_random runs the pipeline with untrained models)"
        )
        raise FileNotFoundError(
            f"{setting}={spec}: checkpoint not found: {path}{hint if embedded else ''}"
        )
    return path


def load_target(spec: str, store: AssetStore | None = None) -> TransformerModel:
    """The target, by asset card name (through fairseq2's model hub) or checkpoint path
    (`save_model`'s), in fp32."""
    store = store or asset_store()
    if not is_path(spec):
        return load_card_model(
            retrieve_card(store, "model.target", spec), "model.target", torch.float32
        )
    try:
        return load_model(_checkpoint("model.target", spec))
    except ValueError as error:
        raise ValueError(f"model.target={spec}: {error}") from None


def load_draft(
    spec: str, target: TransformerModel, store: AssetStore | None = None, *, target_spec: str = ""
) -> Draft:
    """A draft by asset card name or checkpoint path, in its target's data type: a model
    of a fairseq2 family through fairseq2's model hub, a draft decoder over the target's
    encoder or a draft head over its states built over `target`. It must share the
    target's vocabulary, and a head must have been trained over this target."""
    store = store or asset_store()
    dtype = next(target.parameters()).dtype
    where = f"model.draft={spec} does not fit model.target={target_spec or '(given)'}"
    if is_path(spec):
        path: Path | None = _checkpoint("model.draft", spec)
    else:
        card = retrieve_card(store, "model.draft", spec)
        path = own_draft_path(card)
        if path is None:
            draft: Draft = load_card_model(card, "model.draft", dtype)
    if path is not None:
        try:
            draft = load_model(path, dtype, target=target)
        except HeadTargetMismatch as error:
            raise ValueError(
                f"{where}: a draft head made for another target ({error}); model.draft=none "
                'decodes without one, or train one for it (README, "Your own model")'
            ) from None
        except ValueError as error:
            raise ValueError(f"model.draft={spec}: {error}") from None
    try:
        check_same_vocabulary(target, draft)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return draft


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
