"""Text in, text out: batches sentences by length for any fairseq2 Seq2SeqGenerator."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput

from specbeam.data.batches import pad, token_batches


def target_prompt(tokenizer: Tokenizer, tgt_lang: str) -> torch.Tensor:
    """NLLB's target prefix `[</s>, __lang__]`: the target encoder's output minus its EOS."""
    return tokenizer.create_encoder(lang=tgt_lang, mode="target")("")[:-1]


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """Lone surrogates have no UTF-8 form and crash SentencePiece: each becomes U+FFFD, as
    input_errors=replace does for invalid bytes in a file. The apps decode their input
    bytes themselves, so only Python callers can pass them (e.g. text decoded with
    `surrogateescape`)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def encode_sources(
    tokenizer: Tokenizer, sources: Sequence[str], src_lang: str
) -> list[torch.Tensor]:
    encode = tokenizer.create_encoder(lang=src_lang, mode="source")
    return [encode(encodable(s)) for s in sources]


@dataclass(frozen=True)
class Translation:
    text: str
    score: float | None
    """The generator's score (fairseq2's beam search: the log-probability normalised by
    length^len_penalty); None where the generator gives none."""


def translate_texts(
    generator: Seq2SeqGenerator,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    src_lang: str,
    tgt_lang: str,
    *,
    max_tokens: int = 2048,
    on_batch: Callable[[list[int], SequenceGeneratorOutput], None] | None = None,
    on_truncate: Callable[[list[int]], None] | None = None,
) -> list[str]:
    """Each source's best translation, in input order (`translate_nbest` with n = 1)."""
    nbest = translate_nbest(
        generator, tokenizer, sources, src_lang, tgt_lang, nbest=1, max_tokens=max_tokens,
        on_batch=on_batch, on_truncate=on_truncate,
    )  # fmt: skip
    return [hyps[0].text for hyps in nbest]


def translate_nbest(
    generator: Seq2SeqGenerator,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    src_lang: str,
    tgt_lang: str,
    *,
    nbest: int,
    max_tokens: int = 2048,
    on_batch: Callable[[list[int], SequenceGeneratorOutput], None] | None = None,
    on_truncate: Callable[[list[int]], None] | None = None,
) -> list[list[Translation]]:
    """Translates in length-sorted batches and returns each source's `nbest` best
    hypotheses (fewer if the generator gives fewer), best first, in input order.

    A source longer than the model accepts is cut to its first tokens (its end-of-sentence
    kept) and translated; `on_truncate` gets the indices of such sources.
    """
    outputs: list[list[Translation]] = [[] for _ in sources]
    for batch, out, translations in translate_batches(
        generator, tokenizer, sources, src_lang, tgt_lang, nbest=nbest, max_tokens=max_tokens,
        on_truncate=on_truncate,
    ):  # fmt: skip
        for i, hyps in zip(batch, translations, strict=True):
            outputs[i] = hyps
        if on_batch is not None:
            on_batch(batch, out)
    return outputs


def translate_batches(
    generator: Seq2SeqGenerator,
    tokenizer: Tokenizer,
    sources: Sequence[str],
    src_lang: str,
    tgt_lang: str,
    *,
    nbest: int,
    max_tokens: int = 2048,
    on_truncate: Callable[[list[int]], None] | None = None,
    order: Callable[[list[list[int]]], list[list[int]]] | None = None,
) -> Iterator[tuple[list[int], SequenceGeneratorOutput, list[list[Translation]]]]:
    """`translate_nbest` batch by batch, as each is decoded: its source indices, the
    generator's output and their translations. `order` may reorder the length-sorted
    batches or drop some; a batch's members, and so its outputs, stay as they are."""
    decode = tokenizer.create_decoder(skip_special_tokens=True)
    pad_idx = tokenizer.vocab_info.pad_idx or 0
    prompt = target_prompt(tokenizer, tgt_lang)
    limit = generator.model.max_source_seq_len
    tokens = encode_sources(tokenizer, sources, src_lang)
    long = [i for i, t in enumerate(tokens) if len(t) > limit]
    for i in long:
        tokens[i] = torch.cat([tokens[i][: limit - 1], tokens[i][-1:]])
    if long and on_truncate is not None:
        on_truncate(long)
    batches = token_batches([len(t) for t in tokens], max_tokens)
    for batch in batches if order is None else order(batches):
        src, src_layout = pad([tokens[i] for i in batch], pad_idx)
        prompts, prompt_layout = pad([prompt] * len(batch), pad_idx)
        out = generator(src, src_layout, prompts, prompt_layout)
        translations = [
            [
                Translation(decode(h.seq), None if h.score is None else float(h.score))
                for h in hyps[:nbest]
            ]
            for hyps in out.hypotheses
        ]
        yield batch, out, translations
