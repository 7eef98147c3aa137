"""Long lines are split into pieces (sentences, then clauses, then token windows), their
translations joined: one line in, one line out, the same pieces for every decoding."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import replace
from itertools import accumulate
from pathlib import Path

import pytest
import torch

from specbeam.apps.decoding import DecodingConfig, make_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.apps.split import Splitter, join, sentence_language
from specbeam.apps.translate import TranslateConfig, translate_chunk
from specbeam.data.inference import translate_texts
from specbeam.data.task import TaskConfig
from specbeam.integration.models import ModelPairConfig, build_model
from tests.conftest import TARGET_ARCH

REPO = Path(__file__).resolve().parents[2]
LIMIT = 50  # the default (conf/translate.yaml)
DEV = TaskConfig().split("dev")
PARAGRAPH = " ".join(p.source for p in DEV[:8])  # Song of Solomon 1:1-8, 290 pieces


@pytest.fixture(scope="module")
def tokenizer():
    return ModelPairConfig().load_tokenizer()


@pytest.fixture(scope="module")
def splitter(tokenizer) -> Splitter:
    return Splitter(tokenizer, "spa_Latn", LIMIT)


def test_paragraph_is_split_into_its_sentences(splitter) -> None:
    split = splitter(PARAGRAPH)
    assert splitter.count(PARAGRAPH) > LIMIT and not split.cut_without_boundary
    assert " ".join(split.pieces) == PARAGRAPH  # cut only between sentences
    assert all(piece[-1] in ".?!" for piece in split.pieces)
    # every verse ends a piece (all eight end a sentence); "¡…! porque" stays one piece
    ends = set(accumulate(len(piece) + 1 for piece in split.pieces))
    assert set(accumulate(len(p.source) + 1 for p in DEV[:8])) <= ends
    assert DEV[1].source in split.pieces and len(split.pieces) == 10


def test_sentence_above_the_limit_is_cut_at_clauses(splitter) -> None:
    line = ("Y dijo Dios: " * 300)[:3900]  # issue 17: one "sentence", ~1,200 pieces
    split = splitter(line)
    assert not split.cut_without_boundary and len(split.pieces) == 25  # 12 clauses each
    assert all(piece.endswith("Dios:") for piece in split.pieces)
    assert all(splitter.count(piece) <= LIMIT for piece in split.pieces)
    assert " ".join(split.pieces) == line.strip()


def test_boundary_free_line_is_cut_by_token_window(splitter) -> None:
    line = "y dijo dios que sea la luz " * 60
    split = splitter(line)
    assert split.cut_without_boundary and len(split.pieces) > 1
    assert all(splitter.count(piece) <= LIMIT for piece in split.pieces)
    assert " ".join(split.pieces) == line.strip()
    word = splitter("x" * 3000)  # no space at all: cut inside the word
    assert word.cut_without_boundary
    assert all(0 < splitter.count(piece) <= LIMIT for piece in word.pieces)
    assert "".join(word.pieces) == "x" * 3000


def test_line_of_only_punctuation(splitter) -> None:
    assert splitter("¡¿...?!").pieces == ["¡¿...?!"]  # short: untouched
    line = "¡¿...?! ;;; ,,, " * 40
    split = splitter(line)
    assert len(split.pieces) > 1 and all(p.strip() for p in split.pieces)
    assert all(splitter.count(piece) <= LIMIT for piece in split.pieces)
    assert "".join(split.pieces).replace(" ", "") == line.replace(" ", "")


def test_short_lines_and_off_are_untouched(tokenizer, splitter) -> None:
    line = "  Y dijo Dios: Sea la luz: y fué la luz.  "
    assert splitter(line).pieces == [line]
    assert Splitter(tokenizer, "spa_Latn", 0)(PARAGRAPH * 5).pieces == [PARAGRAPH * 5]
    assert join(["  One. "]) == "  One. " and join(["One. ", "", " Two."]) == "One. Two."


def test_language_codes_are_mapped_for_sentencex(caplog) -> None:
    assert sentence_language("spa_Latn") == "es" and sentence_language("es") == "es"
    with caplog.at_level(logging.WARNING):
        assert sentence_language("xyz_Latn") == "en"
    assert "xyz_Latn" in caplog.text


def test_split_off_keeps_todays_behaviour(tokenizer, caplog) -> None:
    """split_above_tokens=0: whole lines to translate_texts, cut to the model's source
    length with the truncation warning, no `pieces` in the records."""
    torch.manual_seed(0)
    arch = replace(TARGET_ARCH, vocab_size=tokenizer.vocab_info.size, max_seq_len=64)
    generator = make_generator(
        DecodingConfig(name="beam", speculative=False, max_gen_len=[0.5, 4]),
        build_model(arch).eval(),
        None,
        tokenizer.vocab_info,
    )
    cfg = TranslateConfig(split_above_tokens=0, hardware=HardwareConfig(threads=1))
    lines = ["Hola.", "", PARAGRAPH]
    with caplog.at_level(logging.WARNING):
        texts, records = translate_chunk(
            cfg, tokenizer, generator, Splitter(tokenizer, "spa_Latn", 0), lines, 0, 0
        )
    whole = translate_texts(generator, tokenizer, ["Hola.", PARAGRAPH], "spa_Latn", "eng_Latn")
    assert texts == [whole[0], "", whole[1]]
    assert "line 3 exceeds the model's 64 source tokens" in caplog.text
    assert not any("pieces" in r for r in records)


def test_translate_keeps_lines_and_records_pieces(tmp_path) -> None:
    """End to end: one line out per line in, blank lines kept, the split line's pieces in
    the stats file and the job's warning, spec_beam == beam, compare= on the pieces."""
    source = tmp_path / "doc.es"
    source.write_text(f"Hola.\n\n{PARAGRAPH}\n   \nAdiós.\n", encoding="utf-8")
    outputs = {}
    for decoding in ("beam", "spec_beam"):
        out, stats = tmp_path / f"{decoding}.en", tmp_path / f"{decoding}.jsonl"
        cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
               "decoding.max_gen_len=[0.5,4]", f"decoding={decoding}", f"input={source}",
               f"output={out}", f"stats_file={stats}", f"hydra.run.dir={tmp_path}/{decoding}"]  # fmt: skip
        if decoding == "spec_beam":
            cmd.append("compare=beam")
        result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        outputs[decoding] = out.read_text(encoding="utf-8").split("\n")[:-1]
        records = [json.loads(line) for line in stats.read_text().splitlines()]
        assert [r["line"] for r in records] == [1, 2, 3, 4, 5]
        assert [r.get("pieces") for r in records] == [None, None, 10, None, None]
        assert records[2]["cut_without_boundary"] is False
        assert "split 1 line longer than 50 source tokens" in result.stderr
        assert "translations: line 3 (10 pieces)" in result.stderr
    assert len(outputs["beam"]) == 5 and outputs["beam"] == outputs["spec_beam"]
    assert outputs["beam"][1] == outputs["beam"][3] == ""
    assert "for 12 sentences from 3 lines, one at a time" in result.stderr
    assert "identical outputs: 12/12" in result.stderr
