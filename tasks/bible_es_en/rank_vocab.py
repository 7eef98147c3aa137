"""Adds the target-side vocabulary ranking to a draft head checkpoint (`draft_vocab`).

    python tasks/bible_es_en/rank_vocab.py                      # models/head.pt, in place
    python tasks/bible_es_en/rank_vocab.py --head ~/.cache/specbeam/head/best.pt

Counts the tokens of the English side of data/train.tsv (a second or so).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specbeam.data.task import TaskConfig
from specbeam.integration.models import ModelPairConfig, atomic_save
from specbeam.search.head import HEAD_KIND
from specbeam.training.vocab import ranked_tokens

HERE = Path(__file__).resolve().parent


def add_ranking(head: Path) -> None:
    ckpt = torch.load(head, map_location="cpu", weights_only=True)
    if ckpt.get("kind") != HEAD_KIND:
        raise SystemExit(f"error: {head} is not a draft head checkpoint")
    task = TaskConfig()
    encode = ModelPairConfig().load_tokenizer().create_raw_encoder()  # the text's tokens, no tags
    ckpt["vocab"] = ranked_tokens((p.target for p in task.split("train")), encode)
    atomic_save(ckpt, head)
    print(f"{head}: {len(ckpt['vocab'])} ranked tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", type=Path, default=HERE / "models" / "head.pt")
    add_ranking(parser.parse_args().head.expanduser())


if __name__ == "__main__":
    main()
