"""A translation task: its data splits, tokenizer and languages."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fairseq2.data.tokenizers import Tokenizer
from fairseq2.models.nllb import NllbTokenizerConfig, load_nllb_tokenizer

from specbeam.apps.data import Pair, read_tsv
from specbeam.paths import REPO_ROOT


@dataclass(kw_only=True)
class TaskConfig:
    name: str = "bible_es_en"
    data_dir: str = "tasks/bible_es_en/data"
    tokenizer: str = "tasks/bible_es_en/spm.model"
    src_lang: str = "spa_Latn"
    tgt_lang: str = "eng_Latn"
    langs: list[str] = field(default_factory=lambda: ["spa_Latn", "eng_Latn"])

    def path(self, relative: str) -> Path:
        """Task paths are relative to the repository unless absolute."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() else REPO_ROOT / p

    def split(self, name: str) -> list[Pair]:
        path = self.path(self.data_dir) / f"{name}.tsv"
        if not path.exists():
            raise FileNotFoundError(f"task {self.name}: split '{name}' not found at {path}")
        return read_tsv(path)

    def load_tokenizer(self) -> Tokenizer:
        config = NllbTokenizerConfig(langs=list(self.langs), default_lang=self.tgt_lang)
        return load_nllb_tokenizer(self.path(self.tokenizer), config)
