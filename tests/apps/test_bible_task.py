"""The embedded task: data preparation from the Debian modules, committed splits, tokenizer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from fairseq2.data.tokenizers import load_tokenizer
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.models import load_model

from specbeam.data.inference import translate_texts
from specbeam.data.pairs import read_tsv
from specbeam.data.task import TaskConfig
from specbeam.integration.models import ModelPairConfig, load_draft
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.stats import SpecStats

REPO = Path(__file__).resolve().parents[2]
PREPARE = REPO / "tasks" / "bible_es_en" / "prepare.py"
SWORD_CONFS = [
    Path("/usr/share/sword/mods.d") / f"{m}.conf" for m in ("spaRV1909eb", "engKJV2006eb")
]


@pytest.mark.skipif(
    not all(p.exists() for p in SWORD_CONFS),
    reason="needs the Debian packages sword-text-sparv and sword-text-kjv (scripts/setup.sh "
    "installs them as root)",
)
def test_prepare_two_short_books_reproduces_committed_test_rows(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, str(PREPARE), "--books", "Ruth,Jude", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = read_tsv(tmp_path / "test.tsv")
    assert len(rows) == 85 + 25  # every verse of Ruth and Jude aligns
    committed = {p.ref: p for p in TaskConfig().split("test")}
    for row in rows:
        assert committed[row.ref] == row
    ruth_1_1 = next(r for r in rows if r.ref == "Ruth 1:1")
    assert ruth_1_1.source.startswith("Y aconteció en los días")  # RV1909's "Y ACONTECIÓ" fixed
    assert "<" not in ruth_1_1.source + ruth_1_1.target
    assert (tmp_path / "train.tsv").read_text() == ""


def test_committed_splits_are_disjoint_by_book() -> None:
    task = TaskConfig()
    books = {name: {p.ref.rsplit(" ", 1)[0] for p in task.split(name)} for name in ("dev", "test")}
    assert not books["dev"] & books["test"]
    assert 1400 <= len(task.split("test")) <= 1600
    assert 950 <= len(task.split("dev")) <= 1100


def test_tokenizer_has_fairseq2_special_indices() -> None:
    tokenizer = ModelPairConfig().load_tokenizer()
    info = tokenizer.vocab_info
    assert (info.size, info.pad_idx, info.unk_idx, info.bos_idx, info.eos_idx) == (8000, 0, 1, 2, 3)
    encoder = tokenizer.create_encoder(lang="spa_Latn", mode="source")
    tokens = encoder("En el principio crió Dios los cielos y la tierra.")
    assert int(tokens[-1]) == info.eos_idx and int(tokens[0]) > 7990  # __spa_Latn__ first
    decoded = tokenizer.create_decoder(skip_special_tokens=True)(tokens)
    assert decoded == "En el principio crió Dios los cielos y la tierra."


def test_shipped_target_loads_by_name_and_translates() -> None:
    """The committed target, through fairseq2's hubs by its card name (the extension
    registers tasks/*/cards): beam 5 on the first 20 test verses scores BLEU 26.3; the
    floor leaves room for platform rounding, not for a broken model (an untrained one
    scores ~0)."""
    model = load_model("bible_es_en_target", dtype=torch.float32).eval()
    tokenizer = load_tokenizer("bible_es_en_target")
    generator = BeamSearchSeq2SeqGenerator(
        model, tokenizer.vocab_info, beam_size=5, max_gen_len=(1.5, 10)
    )
    pairs = TaskConfig().split("test")[:20]
    hyps = translate_texts(generator, tokenizer, [p.source for p in pairs], "spa_Latn", "eng_Latn")
    assert sacrebleu.corpus_bleu(hyps, [[p.target for p in pairs]]).score > 15.0


def test_shipped_pair_loads_by_name_and_speculative_equals_beam() -> None:
    """Target and draft head through their cards (the head's card is completed with the
    target's modules it reads): exact speculative beam search translates the first 8 test
    verses as fairseq2's beam search does, taking several steps per target pass."""
    target = load_model("bible_es_en_target", dtype=torch.float32).eval()
    draft = load_draft("bible_es_en_head", target)
    tokenizer = load_tokenizer("bible_es_en_target")
    vocab = tokenizer.vocab_info
    sources = [p.source for p in TaskConfig().split("test")[:8]]
    beam = BeamSearchSeq2SeqGenerator(target, vocab, beam_size=5, max_gen_len=(1.5, 10))
    spec = SpeculativeBeamSearchSeq2SeqGenerator(
        target, draft, vocab, beam_size=5, max_gen_len=(1.5, 10), gamma=4, draft_width=10
    )
    stats = SpecStats()
    want = translate_texts(beam, tokenizer, sources, "spa_Latn", "eng_Latn")
    got = translate_texts(
        spec, tokenizer, sources, "spa_Latn", "eng_Latn",
        on_batch=lambda _, out: stats.merge(out.stats),
    )  # fmt: skip
    assert got == want
    assert stats.tau > 1.2
