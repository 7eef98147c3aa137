"""A translation task is configuration: where its parallel text is, and its languages.

A split (train, dev, test) is a file in `data_dir`: a TSV whose columns the config names
(the source is the column named `src_lang`, the target the one named `tgt_lang`, so one
TSV of several languages serves every direction; a `ref` column, if named, identifies
rows), or two plain files, one sentence a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specbeam.data.pairs import Pair, read_columns, read_parallel_files
from specbeam.paths import shipped, user_path


@dataclass(kw_only=True)
class TaskConfig:
    name: str = "bible_es_en"
    """The task's name, that of its file (conf/task/<name>.yaml); a label only."""
    src_lang: str = "spa_Latn"
    """The source language code, as the target's tokenizer spells it (NLLB: `spa_Latn`)."""
    tgt_lang: str = "eng_Latn"
    """The target language code, as the target's tokenizer spells it (NLLB: `eng_Latn`)."""
    data_dir: str = str(shipped("tasks/bible_es_en/data"))
    """The splits' directory: `<split>.tsv` files, or plain files (`text_suffixes`);
    relative to the working directory."""
    columns: list[str] = field(default_factory=lambda: ["ref", "spa_Latn", "eng_Latn"])
    """The TSV's columns, in order; those named `src_lang` and `tgt_lang` are used."""
    text_suffixes: list[str] | None = None
    """[source, target], e.g. [es, en]: a split is two plain files, `<split>.es` and
    `<split>.en`, paired line by line; None: a TSV."""

    def split(self, name: str) -> list[Pair]:
        if self.text_suffixes is None:
            path = self._split_file(name, "tsv")
            return read_columns(path, self.columns, self.src_lang, self.tgt_lang)
        if len(self.text_suffixes) != 2:
            raise ValueError(
                f"task.text_suffixes={list(self.text_suffixes)} is invalid: need [source, target]"
            )
        source, target = (self._split_file(name, suffix) for suffix in self.text_suffixes)
        return read_parallel_files(source, target, name)

    def _split_file(self, split: str, suffix: str) -> Path:
        path = user_path(self.data_dir) / f"{split}.{suffix}"
        if not path.exists():
            raise FileNotFoundError(
                f"split '{split}' not found at {path} (task.data_dir={self.data_dir})"
            )
        return path
