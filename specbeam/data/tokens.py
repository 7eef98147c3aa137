"""Sentence pairs as token sequences, as the target's tokenizer encodes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fairseq2.data.tokenizers import Tokenizer
from torch import Tensor

from specbeam.data.pairs import Pair


@dataclass(frozen=True)
class TokenizedPair:
    source: Tensor  # (S,) with language token and EOS
    target: Tensor  # (T,) = [EOS, lang, pieces..., EOS]


def tokenize_pairs(
    pairs: Sequence[Pair], tokenizer: Tokenizer, src_lang: str, tgt_lang: str
) -> list[TokenizedPair]:
    src_enc = tokenizer.create_encoder(lang=src_lang, mode="source")
    tgt_enc = tokenizer.create_encoder(lang=tgt_lang, mode="target")
    return [TokenizedPair(src_enc(p.source), tgt_enc(p.target)) for p in pairs]


def target_prompt_len(tokenizer: Tokenizer, tgt_lang: str) -> int:
    """Tokens the target encoder puts before a sentence (NLLB: `</s> __lang__`): the
    prompt generation starts from."""
    return len(tokenizer.create_encoder(lang=tgt_lang, mode="target")("")) - 1
