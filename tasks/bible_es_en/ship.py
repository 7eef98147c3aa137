"""Ships a trained pair: fp16 copies in models/ and fairseq2 asset cards in cards/.

    python tasks/bible_es_en/ship.py --target ~/.cache/specbeam/target/best.pt \
        --draft ~/.cache/specbeam/draft/best.pt

The draft keeps its kind: a decoder over the target's encoder (`shallow_over`) is saved
without the encoder, and its card's family tells specbeam to complete it with the target's.
A draft head (`python -m specbeam.train_head`) ships as models/head.pt, card
`bible_es_en_head`, and replaces models/draft.pt (both would not fit the 100 MB budget),
with the ranking of the target-side tokens it drafts from (rank_vocab.py, FR-Spec).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from rank_vocab import add_ranking  # the script beside this one

from specbeam.data.task import TaskConfig
from specbeam.integration.cards import model_card, tokenizer_fields, write_cards
from specbeam.integration.models import ModelArch, load_model, save_head, save_model
from specbeam.search.head import HEAD_KIND, DraftHead

HERE = Path(__file__).resolve().parent
BUDGET_MB = 100  # target + draft + tokenizer, in 10^6 bytes


def is_head(source: Path) -> bool:
    return torch.load(source, map_location="cpu", weights_only=True).get("kind") == HEAD_KIND


def ship(source: Path, out: Path, target_source: Path | None = None) -> None:
    """Writes `source` in fp16 to `out`."""
    ckpt = torch.load(source, map_location="cpu", weights_only=True)
    shares = bool(ckpt.get("shares_encoder", False)) or ckpt.get("kind") == HEAD_KIND
    target = load_model(target_source) if shares and target_source else None
    model = load_model(source, target=target)
    if isinstance(model, DraftHead):
        save_head(model, out, torch.float16)
        return
    save_model(model, ModelArch(**ckpt["arch"]), out, torch.float16, shares_encoder=shares)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, help="omit to ship the target alone")
    args = parser.parse_args()
    models, cards_dir = HERE / "models", HERE / "cards"
    models.mkdir(exist_ok=True)
    ship(args.target.expanduser(), models / "target.pt")
    shipped = [models / "target.pt"]
    draft_name, draft_file = "bible_es_en_draft", models / "draft.pt"
    if args.draft and is_head(args.draft.expanduser()):
        # The head replaces the separate draft: both would not fit the budget.
        draft_name, draft_file = "bible_es_en_head", models / "head.pt"
        (models / "draft.pt").unlink(missing_ok=True)
    if args.draft:
        ship(args.draft.expanduser(), draft_file, args.target.expanduser())
        shipped.append(draft_file)
        if draft_name == "bible_es_en_head":
            add_ranking(draft_file)
    task = TaskConfig()
    spm = HERE / "spm.model"
    langs = [task.src_lang, task.tgt_lang]
    tokenizer = tokenizer_fields(spm, cards_dir, langs, task.tgt_lang)
    cards = [{**model_card("bible_es_en_target", models / "target.pt", cards_dir), **tokenizer}]
    if args.draft:
        cards.append({**model_card(draft_name, draft_file, cards_dir), **tokenizer})
    write_cards(cards_dir / "bible_es_en.yaml", cards)
    sizes = {p.name: p.stat().st_size / 1e6 for p in (*shipped, spm)}
    total = sum(sizes.values())
    print(
        ", ".join(f"{name} {mb:.1f} MB" for name, mb in sizes.items()) + f"; total {total:.1f} MB"
    )
    if total > BUDGET_MB:
        raise SystemExit(
            f"error: the shipped pair takes {total:.1f} MB, over the {BUDGET_MB} MB budget"
        )


if __name__ == "__main__":
    main()
