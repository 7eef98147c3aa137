"""A task is configuration: parallel text from a TSV with named columns or from two
plain files, with the language codes; the embedded Bible task is the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from specbeam.data.pairs import Pair
from specbeam.data.task import TaskConfig


def test_the_default_is_the_embedded_bible_task() -> None:
    first = TaskConfig().split("test")[0]
    assert first.ref == "Ruth 1:1" and first.source.startswith("Y aconteció")


def test_tsv_columns_are_named_by_language(tmp_path: Path) -> None:
    """One TSV of three languages serves any direction; other columns are ignored."""
    (tmp_path / "dev.tsv").write_text("a\tBonjour\tHello\tHola\nb\tMerci\tThanks\tGracias\n")
    task = TaskConfig(
        data_dir=str(tmp_path), columns=["ref", "fra_Latn", "eng_Latn", "spa_Latn"],
        src_lang="spa_Latn", tgt_lang="fra_Latn",
    )  # fmt: skip
    assert task.split("dev") == [Pair("a", "Hola", "Bonjour"), Pair("b", "Gracias", "Merci")]


def test_tsv_without_ref_column_numbers_its_rows(tmp_path: Path) -> None:
    (tmp_path / "test.tsv").write_text("Hello\tHola\nThanks\tGracias\n")
    task = TaskConfig(data_dir=str(tmp_path), columns=["eng_Latn", "spa_Latn"])
    assert task.split("test") == [Pair("1", "Hola", "Hello"), Pair("2", "Gracias", "Thanks")]


def test_plain_files_pair_line_by_line(tmp_path: Path) -> None:
    (tmp_path / "dev.es").write_text("Hola\nGracias\n")
    (tmp_path / "dev.en").write_text("Hello\nThanks\n")
    task = TaskConfig(data_dir=str(tmp_path), text_suffixes=["es", "en"])
    assert task.split("dev") == [Pair("dev:1", "Hola", "Hello"), Pair("dev:2", "Gracias", "Thanks")]


@pytest.mark.parametrize(
    ("settings", "files", "expected"),
    [
        (
            {"columns": ["ref", "spa_Latn", "deu_Latn"]},
            {"dev.tsv": "a\tHola\tHallo\n"},
            "task.tgt_lang=eng_Latn names no column of",
        ),
        ({}, {"dev.tsv": "a\tHola\n"}, "dev.tsv:1: expected 3 tab-separated fields"),
        (
            {"text_suffixes": ["es", "en"]},
            {"dev.es": "Hola\nGracias\n", "dev.en": "Hello\n"},
            "dev.es has 2 lines but",
        ),
        (
            {"text_suffixes": ["es", "en"]},
            {"dev.es": "Hola\n", "dev.en": "Hello\nThanks\n"},
            "dev.es has 1 line but",
        ),
        (
            {"text_suffixes": ["es"]},
            {},
            "task.text_suffixes=['es'] is invalid: need [source, target]",
        ),
    ],
)
def test_bad_task_settings_are_one_line(
    tmp_path: Path, settings: dict, files: dict[str, str], expected: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    task = TaskConfig(data_dir=str(tmp_path), **settings)
    with pytest.raises(ValueError) as error:
        task.split("dev")
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_a_missing_split_names_the_setting(tmp_path: Path) -> None:
    task = TaskConfig(data_dir=str(tmp_path), text_suffixes=["es", "en"])
    with pytest.raises(
        FileNotFoundError,
        match=rf"^split 'train' not found at .*train.es \(task.data_dir={tmp_path}\)$",
    ):
        task.split("train")
