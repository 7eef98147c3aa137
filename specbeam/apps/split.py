"""Long source lines: split into pieces the model translates well, then join the pieces'
translations, so that one line in stays one line out.

The embedded model was trained on verses (source lengths in SentencePiece pieces: mean 31,
p50 29, p90 49, p99 68, max 110); given several sentences at once it drops some, and a
1,200-token line decoded whole runs for minutes. A line above `split_above_tokens` pieces is
split into sentences with sentencex; a sentence still too long is cut at clause punctuation
(`;` `:` `,` and a space), its clauses packed back in order up to the limit, and a clause
still too long into token windows (between words where it can). Splitting depends only on
the text and the tokenizer, so every decoding (plain or speculative) sees the same pieces.

Why sentencex: on paragraphs of joined dev verses it finds about as many sentence-final
verse boundaries as pysbd at a small fraction of its time (docs/bench.md); neither cuts at
`:` or `;`, and joining sentencex's segments gives back the input.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import sentencex
from fairseq2.data.tokenizers import Tokenizer

from specbeam.data.inference import encodable

log = logging.getLogger("specbeam.split")

# NLLB language codes (ISO 639-3 + script) -> ISO 639-1, which sentencex needs: it reads any
# code it does not know as English, silently.
_ISO_639_1 = dict(
    pair.split(":")
    for pair in (
        "afr:af amh:am arb:ar ary:ar arz:ar azj:az bel:be ben:bn bos:bs bul:bg cat:ca ces:cs "
        "cym:cy dan:da deu:de ell:el eng:en epo:eo est:et eus:eu fin:fi fra:fr gla:gd gle:ga "
        "glg:gl guj:gu heb:he hin:hi hrv:hr hun:hu hye:hy ind:id isl:is ita:it jpn:ja kat:ka "
        "kaz:kk khm:km kan:kn kor:ko lit:lt ltz:lb lvs:lv mal:ml mar:mr mkd:mk mlt:mt mya:my "
        "nld:nl nno:nn nob:nb npi:ne pan:pa pes:fa pol:pl por:pt ron:ro rus:ru sin:si slk:sk "
        "slv:sl som:so spa:es als:sq srp:sr swe:sv swh:sw tam:ta tel:te tgl:tl tha:th tur:tr "
        "ukr:uk urd:ur uzn:uz vie:vi yue:zh zho:zh zsm:ms"
    ).split()
)

_CLAUSE_END = re.compile(r"(?<=[;:,]\s)")
"""After clause punctuation and the space that follows it."""
_WORD_START = re.compile(r"(?<=\s)(?=\S)")


def sentence_language(src_lang: str) -> str:
    """The ISO 639-1 code sentencex needs for a task language (`spa_Latn` -> `es`); an
    unknown language is split with sentencex's English rules, and said so."""
    code = src_lang.split("_")[0].lower()
    if len(code) == 2:
        return code
    if code not in _ISO_639_1:
        log.warning("no ISO 639-1 code known for %s: splitting its sentences as English", src_lang)
    return _ISO_639_1.get(code, "en")


@dataclass(frozen=True)
class Split:
    pieces: list[str]
    """The source's pieces, in order (the source itself when it is short enough)."""
    cut_without_boundary: bool = False
    """A cut fell between words or inside one, not at sentence or clause punctuation."""


class Splitter:
    """Splits sources longer than `split_above_tokens` SentencePiece pieces (the task's
    source encoder, language tag and end of sentence not counted); 0 splits nothing."""

    def __init__(self, tokenizer: Tokenizer, src_lang: str, split_above_tokens: int) -> None:
        if split_above_tokens < 0:
            raise ValueError(
                f"split_above_tokens={split_above_tokens} is invalid: must be ≥ 0 (0 = off)"
            )
        self.limit = split_above_tokens
        self._encoder = tokenizer.create_encoder(lang=src_lang, mode="source")
        self._specials = len(self._encoder.prefix_indices) + len(self._encoder.suffix_indices)
        self._lang = sentence_language(src_lang) if split_above_tokens else ""

    def __call__(self, source: str) -> Split:
        if not self.limit or self.count(source) <= self.limit:
            return Split([source])
        pieces: list[str] = []
        cut_without_boundary = False
        for sentence in self.sentences(encodable(source)):
            if self.count(sentence) <= self.limit:
                pieces.append(sentence)
                continue
            for clause in self._pack(_CLAUSE_END.split(sentence)):
                if self.count(clause) <= self.limit:
                    pieces.append(clause)
                    continue
                cut_without_boundary = True
                pieces += self._pack(
                    [w for word in _WORD_START.split(clause) for w in self._window(word)]
                )
        return Split([p.strip() for p in pieces if p.strip()], cut_without_boundary)

    def count(self, text: str) -> int:
        """Pieces of `text`. Pieces never span whitespace, so the counts of texts cut at a
        space add up to the count of the whole."""
        return len(self._encoder(encodable(text))) - self._specials

    def sentences(self, text: str) -> list[str]:
        """sentencex's sentences, each with its trailing whitespace; one that starts with a
        lowercase letter rejoins the one before, undoing cuts such as "¡…! porque"."""
        sentences: list[str] = []
        for segment in sentencex.segment(self._lang, text):
            head = segment.lstrip()
            if sentences and (not head or head[0].islower()):
                sentences[-1] += segment
            else:
                sentences.append(segment)
        return sentences

    def _pack(self, units: Sequence[str]) -> list[str]:
        """Consecutive units (clauses, words) joined into texts of at most `limit` pieces,
        filled in order; a unit above the limit stays alone."""
        packed: list[str] = []
        size = self.limit + 1
        for unit, n in zip(units, map(self.count, units), strict=True):
            if size + n > self.limit:
                packed.append(unit)
                size = n
            else:
                packed[-1] += unit
                size += n
        return packed

    def _window(self, word: str) -> list[str]:
        """A word longer than `limit` pieces, cut every `limit - 1` pieces (re-encoded, a
        window can gain a word-start piece), in their normalized form: the model reads it."""
        if self.count(word) <= self.limit:
            return [word]
        tokens = self._encoder.encode_as_tokens(encodable(word))
        body = tokens[
            len(self._encoder.prefix_indices) : len(tokens) - len(self._encoder.suffix_indices)
        ]
        size = max(self.limit - 1, 1)
        return ["".join(body[i : i + size]).replace("▁", " ") for i in range(0, len(body), size)]


def flatten(splits: Sequence[Split]) -> tuple[list[str], list[int]]:
    """Every split's pieces in one list (to translate in the same batches), and where each
    split's pieces start in it (one more entry: the end)."""
    return [p for s in splits for p in s.pieces], [0, *accumulate(len(s.pieces) for s in splits)]


def join(translations: Sequence[str]) -> str:
    """One line from its pieces' translations, a single space between them (the
    translation of a line in one piece is kept as it is)."""
    if len(translations) == 1:
        return translations[0]
    return " ".join(t.strip() for t in translations if t.strip())
