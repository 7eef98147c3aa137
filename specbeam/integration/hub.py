"""Models and tokenizers named by fairseq2 asset card or checkpoint path.

Cards resolve through fairseq2's own asset store: fairseq2's cards, the user's
(`FAIRSEQ2_USER_ASSET_DIR`), the embedded tasks' (`tasks/*/cards`, registered by
specbeam's extension) and the directories of an `asset_dirs` setting. Models load
through fairseq2's model hub for the card's family, tokenizers through its tokenizer hub,
so a card works here as it does in a fairseq2 recipe. Every failure is one line naming
the setting and the card or file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

import fairseq2.models
import torch
from fairseq2.assets import (
    AssetCard,
    AssetCardError,
    AssetEnvironmentDetector,
    AssetMetadataError,
    AssetMetadataSource,
    AssetSourceNotFoundError,
    AssetStore,
    FileAssetMetadataLoader,
    StandardAssetStore,
)
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.data.tokenizers.hub import GlobalTokenizerLoader
from fairseq2.error import NotSupportedError
from fairseq2.models.family import ModelFamilyNotKnownError, ModelGatedError
from fairseq2.models.transformer import TransformerModel
from fairseq2.runtime.dependency import get_dependency_resolver, wire_object

from specbeam.paths import user_path

SHALLOW_DRAFT_FAMILY: Final = "specbeam_shallow_draft"
DRAFT_HEAD_FAMILY: Final = "specbeam_draft_head"

CARD_PLACES = "fairseq2's cards, FAIRSEQ2_USER_ASSET_DIR, tasks/*/cards, model.asset_dirs"


def asset_store(dirs: Sequence[str] = ()) -> AssetStore:
    """fairseq2's asset store; with `dirs`, built as fairseq2 builds it (every registered
    source, then these directories), so a card there may name a base card anywhere."""
    resolver = get_dependency_resolver()
    if not dirs:
        return resolver.resolve(AssetStore)
    loader = resolver.resolve(FileAssetMetadataLoader)
    providers = [p for s in resolver.collection.resolve(AssetMetadataSource) for p in s.load()]
    for d in dirs:
        path = user_path(d)
        try:
            providers.append(loader.load(path))
        except AssetSourceNotFoundError:
            raise FileNotFoundError(f"model.asset_dirs: {path} does not exist") from None
    env = resolver.resolve(AssetEnvironmentDetector).detect()
    try:
        return StandardAssetStore(providers, default_env=env)
    except AssetMetadataError as error:
        raise ValueError(f"model.asset_dirs: {error}") from None


def is_path(spec: str) -> bool:
    """A checkpoint path rather than a card name: card names have no `/` and no `.pt`."""
    return "/" in spec or spec.endswith(".pt") or spec.startswith("~")


def retrieve_card(store: AssetStore, setting: str, name: str) -> AssetCard:
    card = store.maybe_retrieve_card(name)
    if card is None:
        here = (
            f"; ./{name} exists, but a checkpoint path needs a / or .pt to be read as one"
            if Path(name).exists()
            else ""
        )
        raise ValueError(f"{setting}={name}: no asset card of that name ({CARD_PLACES}){here}")
    return card


def card_source(card: AssetCard) -> str:
    """Where a card comes from (its file or package), for error messages."""
    return str(card.metadata.get("__source__", "?"))


def own_draft_path(card: AssetCard) -> Path | None:
    """The checkpoint of a draft only specbeam can build over its target (a
    `specbeam_shallow_draft` or `specbeam_draft_head` card); None for any other card."""
    if card.field("model_family").as_(str) not in (SHALLOW_DRAFT_FAMILY, DRAFT_HEAD_FAMILY):
        return None
    return card.field("checkpoint").as_uri().to_path()


def check_checkpoint(card: AssetCard, setting: str) -> None:
    if card.maybe_get_field("checkpoint") is None:
        raise ValueError(f"{setting}={card.name} (card {card_source(card)}) names no checkpoint")


def load_card_model(card: AssetCard, setting: str, dtype: torch.dtype) -> TransformerModel:
    """A model of a fairseq2 family, by its card, through fairseq2's model hub; it must be
    an encoder–decoder (`TransformerModel`): the search decodes trees through it."""
    check_checkpoint(card, setting)
    where = f"{setting}={card.name} (card {card_source(card)})"
    try:
        model = _load_mapped(card, dtype)
    except (AssetCardError, ModelGatedError, ModelFamilyNotKnownError) as error:
        raise ValueError(f"{where}: {str(error).rstrip('.')}{_first_cause(error)}") from None
    if not isinstance(model, TransformerModel):
        family = card.field("model_family").as_(str)
        raise ValueError(
            f"{where} is a {type(model).__name__} (family {family}), not an encoder–decoder "
            "TransformerModel"
        )
    return model.eval()


def _first_cause(error: BaseException) -> str:
    """`: <why>` from the innermost error fairseq2 chained below its own, first sentence:
    "checkpoint is erroneous" alone does not say that the card's `model_config` gives
    another vocabulary size than the checkpoint's weights have."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is error:
        return ""
    text = str(cause).strip()
    first = text.split(". ", 1)[0].rstrip(".")
    return f": {first}{' …' if len(first) + 1 < len(text) else ''}"


def _load_mapped(card: AssetCard, dtype: torch.dtype) -> torch.nn.Module:
    """The model with its checkpoint memory-mapped: the weights are copied from the page
    cache into the model once, rather than read into a buffer, unpickled from it and
    copied. A checkpoint torch cannot map (the legacy, non-zip format) loads as before;
    so does any other error, to report it."""
    try:
        return fairseq2.models.load_model(card, dtype=dtype, mmap=True)
    except AssetCardError:
        return fairseq2.models.load_model(card, dtype=dtype)


def load_card_tokenizer(store: AssetStore, setting: str, name: str) -> Tokenizer:
    """The tokenizer of card `name` as fairseq2's tokenizer hub builds it (NLLB's: its
    languages and control tokens from the card)."""
    card = retrieve_card(store, setting, name)
    if card.maybe_get_field("tokenizer") is None and card.maybe_get_field("tokenizer_ref") is None:
        raise ValueError(
            f"{setting}={name} (card {card_source(card)}) names no tokenizer: set model.tokenizer "
            "to a card that does"
        )
    loader = wire_object(get_dependency_resolver(), GlobalTokenizerLoader, asset_store=store)
    try:
        return loader.load(card, None, None)
    except AssetCardError as error:
        raise ValueError(f"{setting}={name} (card {card_source(card)}): {error}") from None


def languages(tokenizer: Tokenizer) -> list[str] | None:
    """The languages a tokenizer knows, where it says (NLLB's keep them as `_langs`)."""
    langs = getattr(tokenizer, "_langs", None)
    return None if langs is None else sorted(langs)


def check_language(tokenizer: Tokenizer, setting: str, lang: str, mode: str, owner: str) -> None:
    """`lang` must be one the tokenizer of `owner` (a card) encodes."""
    try:
        tokenizer.create_encoder(lang=lang, mode=mode)
    except (NotSupportedError, ValueError):
        known = languages(tokenizer)
        allowed = f": allowed: {', '.join(known)}" if known else ""
        raise ValueError(
            f"{setting}={lang} is not a language of the tokenizer of card {owner}{allowed}"
        ) from None
