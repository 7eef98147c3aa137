"""Parallel text: TSV and plain-file reading, tokenisation and token-budget batching."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.nn import BatchLayout
from torch import Tensor

from specbeam.plural import counted


@dataclass(frozen=True)
class Pair:
    ref: str
    source: str
    target: str


def read_tsv(path: Path) -> list[Pair]:
    """Rows are `ref<TAB>source<TAB>target`; a malformed row names its line."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line_nr, line in enumerate(f, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 3:
                raise ValueError(
                    f"{path}:{line_nr}: expected 3 tab-separated fields, got {len(fields)}"
                )
            pairs.append(Pair(*fields))
    return pairs


def read_columns(path: Path, columns: Sequence[str], source: str, target: str) -> list[Pair]:
    """Rows of a TSV whose columns are named `columns`: the `source` and `target` columns
    (and `ref`, if named; else the line number) make the pairs."""
    for lang, setting in ((source, "task.src_lang"), (target, "task.tgt_lang")):
        if lang not in columns:
            raise ValueError(
                f"{setting}={lang} names no column of {path} (task.columns={list(columns)})"
            )
    src, tgt = columns.index(source), columns.index(target)
    ref = columns.index("ref") if "ref" in columns else None
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line_nr, line in enumerate(f, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(columns):
                raise ValueError(
                    f"{path}:{line_nr}: expected {len(columns)} tab-separated fields "
                    f"(task.columns={list(columns)}), got {len(fields)}"
                )
            name = fields[ref] if ref is not None else str(line_nr)
            pairs.append(Pair(name, fields[src], fields[tgt]))
    return pairs


def read_parallel_files(source: Path, target: Path, split: str) -> list[Pair]:
    """Line i of `source` and line i of `target` make pair `split:i`."""
    sources = source.read_text(encoding="utf-8").splitlines()
    targets = target.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(targets):
        raise ValueError(
            f"{source} has {counted(len(sources), 'line')} but {target} has {len(targets)}: "
            "parallel files pair line by line"
        )
    return [
        Pair(f"{split}:{i}", s, t) for i, (s, t) in enumerate(zip(sources, targets, strict=True), 1)
    ]


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


def pad(seqs: Sequence[Tensor], pad_idx: int) -> tuple[Tensor, BatchLayout]:
    lens = [len(s) for s in seqs]
    out = torch.full((len(seqs), max(lens)), pad_idx, dtype=torch.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, BatchLayout.of(out, lens)


def teacher_forcing(
    pairs: Sequence[TokenizedPair], pad_idx: int
) -> tuple[Tensor, BatchLayout, Tensor, BatchLayout, Tensor]:
    """Padded sources, decoder inputs (each target but its last token) and the tokens they
    must predict (each target but its first): src, src_layout, tgt_in, in_layout, tgt_out."""
    src, src_layout = pad([p.source for p in pairs], pad_idx)
    tgt, _ = pad([p.target for p in pairs], pad_idx)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    in_layout = BatchLayout.of(tgt_in, [len(p.target) - 1 for p in pairs])
    return src, src_layout, tgt_in, in_layout, tgt_out


def token_batches(
    lengths: Sequence[int], max_tokens: int, seed: int | None = None
) -> list[list[int]]:
    """Groups indices of similar length so that rows × longest stays ≤ max_tokens, packed
    from the longest down, so that the smaller batch left over holds the shortest: a
    long sentence left alone would run all its steps at a few rows (CTranslate2 packs
    its batches so too). Each batch's longest comes first.

    With a seed, lengths are jittered before sorting and batch order is shuffled, so
    every epoch sees different batches; without one the order is deterministic.
    """
    rng = random.Random(seed)
    keyed = sorted(
        range(len(lengths)),
        key=lambda i: lengths[i] + (rng.random() if seed is not None else 0),
        reverse=True,
    )
    batches: list[list[int]] = []
    for i in keyed:
        if batches and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    if seed is not None:
        rng.shuffle(batches)
    return batches
