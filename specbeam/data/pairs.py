"""Parallel text: sentence pairs, read from a TSV or from two plain files."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
