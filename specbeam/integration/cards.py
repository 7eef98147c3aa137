"""fairseq2 asset cards for specbeam checkpoints, so fairseq2's hubs load them by name.

    python -m specbeam.cards OUT.yaml NAME=CHECKPOINT [NAME=CHECKPOINT ...] \\
        [--tokenizer SPM_MODEL --langs spa_Latn,eng_Latn --default-lang eng_Latn
         | --tokenizer-of CARD] [--replace]

Paths in the cards are relative to the card file, so a card directory moves with its
checkpoints. Cards written into an existing file are added to it (a fairseq2 card file
holds several YAML documents); a card of a name the file already has replaces it only
with `--replace`. A draft trained over its target's encoder (`shallow_over`) has no encoder
of its own, so no fairseq2 family can build it alone: its card's family is
`specbeam_shallow_draft`, and specbeam's extension builds it over the recipe's model when
a generator names it as `draft_model`; a draft head (`specbeam_draft_head`) likewise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import yaml
from fairseq2.models.nllb import get_nllb_model_hub

from specbeam.integration.hub import (
    DRAFT_HEAD_FAMILY,
    SHALLOW_DRAFT_FAMILY,
    asset_store,
    load_card_tokenizer,
)
from specbeam.integration.models import (
    ModelArch,
    build_model,
    read_checkpoint,
    save_head,
    save_model,
)
from specbeam.plural import counted
from specbeam.search.head import HEAD_KIND, DraftHead, HeadArch


def model_card(name: str, checkpoint: Path, card_dir: Path) -> dict[str, object]:
    ckpt = read_checkpoint(
        checkpoint, "cards are for what specbeam.train and specbeam.train_head write"
    )
    if ckpt.get("kind") == HEAD_KIND:
        family, config = DRAFT_HEAD_FAMILY, ckpt["arch"]
    elif ckpt.get("shares_encoder", False):
        family, config = SHALLOW_DRAFT_FAMILY, asdict(ModelArch.stored(ckpt["arch"], checkpoint))
    else:
        family, config = "nllb", asdict(ModelArch.stored(ckpt["arch"], checkpoint).to_nllb_config())
    return {
        "name": name,
        "model_family": family,
        "model_config": _plain(config),
        "checkpoint": os.path.relpath(checkpoint.resolve(), card_dir.resolve()),
    }


def tokenizer_fields(spm: Path, card_dir: Path, langs: list[str], default_lang: str) -> dict:
    """An NLLB-family SentencePiece tokenizer, to add to a model's card."""
    return {
        "tokenizer": os.path.relpath(spm.resolve(), card_dir.resolve()),
        "tokenizer_family": "nllb",
        "tokenizer_config_overrides": {"langs": list(langs), "default_lang": default_lang},
    }


def write_cards(path: Path, cards: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `python -m specbeam.cards`; paths are relative to this file.\n"
    path.write_text(header + yaml.safe_dump_all(cards, sort_keys=False), encoding="utf-8")


def add_cards(path: Path, cards: list[dict[str, object]], replace: bool = False) -> None:
    """`cards` into the card file `path`, beside the cards it holds: a new file, or the
    cards appended to its text; with `replace`, those of the same name replaced (the
    file is then written anew from its cards)."""
    if not path.exists():
        write_cards(path, cards)
        return
    text = path.read_text(encoding="utf-8")
    try:
        held = [card for card in yaml.safe_load_all(text) if card is not None]
    except yaml.YAMLError as error:
        raise ValueError(
            f"{path} is not a YAML card file: {' '.join(str(error).split())}"
        ) from None
    names = [card.get("name") if isinstance(card, dict) else None for card in held]
    taken = [card["name"] for card in cards if card["name"] in names]
    if taken and not replace:
        raise ValueError(
            f"{path} already has a card named {taken[0]}: give another name, or pass "
            "--replace to replace it"
        )
    if taken:
        new = {card["name"]: card for card in cards}
        kept = [new.pop(name, card) for name, card in zip(names, held, strict=True)]
        write_cards(path, kept + list(new.values()))
        return
    separator = "" if text.endswith("\n") or not text else "\n"
    path.write_text(
        text + separator + "---\n" + yaml.safe_dump_all(cards, sort_keys=False), encoding="utf-8"
    )


def random_nllb_cards(
    card_dir: Path, name: str, arch: str, tokenizer_card: str, head: HeadArch, seed: int = 0
) -> None:
    """Cards `name` and `<name>_head`: an NLLB model of fairseq2's registered architecture
    `arch` (no download) with random weights and the vocabulary of `tokenizer_card`'s
    tokenizer, and a randomly initialised draft head over it, both saved by
    `save_model` / `save_head` into `card_dir/../models`. The target's card names `arch`
    and overrides only the vocabulary size, as an NLLB card does; both cards refer to
    `tokenizer_card`'s tokenizer."""
    tokenizer = load_card_tokenizer(asset_store(), "tokenizer", tokenizer_card)
    config = get_nllb_model_hub().get_arch_config(arch)
    model_arch = ModelArch.of_nllb(
        dataclasses.replace(config, vocab_size=tokenizer.vocab_info.size)
    )
    models = card_dir.parent / "models"
    torch.manual_seed(seed)
    target = build_model(model_arch).eval()
    save_model(target, model_arch, models / f"{name}.pt", torch.float32)
    save_head(DraftHead(target, head), models / f"{name}_head.pt", torch.float32)
    del target
    target_card = {
        "name": name,
        "model_family": "nllb",
        "model_arch": arch,
        "model_config": {"vocab_size": model_arch.vocab_size},
        "checkpoint": os.path.relpath((models / f"{name}.pt").resolve(), card_dir.resolve()),
        "tokenizer_ref": tokenizer_card,
    }
    head_card = model_card(f"{name}_head", models / f"{name}_head.pt", card_dir)
    write_cards(card_dir / f"{name}.yaml", [target_card, {**head_card, "tokenizer_ref": name}])


def _plain(value: object) -> object:
    """YAML-safe: tuples become lists, nested dataclass dicts stay dicts."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the card file to write (.yaml)")
    parser.add_argument("models", nargs="+", help="NAME=CHECKPOINT")
    parser.add_argument("--tokenizer", type=Path, help="SentencePiece model for every card")
    parser.add_argument("--langs", default="spa_Latn,eng_Latn")
    parser.add_argument("--default-lang", default="eng_Latn")
    parser.add_argument(
        "--tokenizer-of", metavar="CARD", help="use the tokenizer of this card (e.g. the target's)"
    )
    parser.add_argument(
        "--replace", action="store_true", help="replace cards of the same name in OUT"
    )
    args = parser.parse_args(argv)
    try:
        if args.tokenizer_of:
            check_card_known(args.tokenizer_of, args.out.parent)
        cards = [card_of(item, args) for item in args.models]
        add_cards(args.out, cards, args.replace)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {counted(len(cards), 'card')} to {args.out}")


def check_card_known(name: str, card_dir: Path) -> None:
    """`--tokenizer-of NAME` must name a card the apps will find beside the ones written
    (`model.asset_dirs=[card_dir]`) or in fairseq2's store; else the cards would be
    written and fail only when used."""
    try:
        store = asset_store([str(card_dir)] if card_dir.is_dir() else [])
    except (ValueError, FileNotFoundError):  # another file there is no card file
        store = asset_store()
    if store.maybe_retrieve_card(name) is None:
        raise ValueError(
            f"--tokenizer-of {name}: no asset card of that name ({card_dir}, fairseq2's cards, "
            "FAIRSEQ2_USER_ASSET_DIR, tasks/*/cards); nothing written"
        )


def card_of(item: str, args: argparse.Namespace) -> dict[str, object]:
    """The card of a command line's `NAME=CHECKPOINT`."""
    name, sep, checkpoint = item.partition("=")
    if not sep or not name or not checkpoint:
        raise ValueError(f"{item} is invalid: expected NAME=CHECKPOINT")
    card_dir = args.out.parent
    card = model_card(name, Path(checkpoint), card_dir)
    if args.tokenizer:
        langs = args.langs.split(",")
        card.update(tokenizer_fields(args.tokenizer, card_dir, langs, args.default_lang))
    elif args.tokenizer_of:
        card["tokenizer_ref"] = args.tokenizer_of  # fairseq2's reference to another card
    return card
