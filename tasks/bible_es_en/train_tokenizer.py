"""Trains the task's joint Spanish+English SentencePiece model on the training split.

fairseq2's NLLB tokenizer family inserts `<pad>` at index 0 and appends the language
and internal control symbols, so the piece count here is 8,000 minus those six: the
fairseq2 vocabulary is exactly 8,000 (pad 0, unk 1, bos 2, eos 3).

    python tasks/bible_es_en/train_tokenizer.py   # data/train.tsv -> spm.model
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import sentencepiece as spm

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 8000
NLLB_EXTRA_SYMBOLS = 6  # <pad>@0, __spa_Latn__, __eng_Latn__, three internal ones


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, default=HERE / "data" / "train.tsv")
    parser.add_argument("--out", type=Path, default=HERE / "spm.model")
    args = parser.parse_args(argv)

    lines = []
    with open(args.train, encoding="utf-8") as f:
        for row in f:
            _, es, en = row.rstrip("\n").split("\t")
            lines += [es, en]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=VOCAB_SIZE - NLLB_EXTRA_SYMBOLS,
        model_type="unigram",
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    args.out.write_bytes(model.getvalue())
    print(f"wrote {args.out} ({VOCAB_SIZE - NLLB_EXTRA_SYMBOLS} pieces from {len(lines)} lines)")


if __name__ == "__main__":
    main()
