"""A real-size check: fairseq2's `dense_600m` NLLB architecture with random weights and
the embedded task's 8000-piece vocabulary (NLLB's own is not available offline), loaded
by card through specbeam's hub as a user's model is, with a randomly initialised draft
head: exact speculative beam search gives fairseq2's beam search output."""

from __future__ import annotations

from pathlib import Path

import pytest
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput
from hydra import compose, initialize_config_dir

import specbeam.apps.translate  # noqa: F401  (registers translate_schema)
from specbeam.apps.app import run_app
from specbeam.data.inference import translate_nbest
from specbeam.integration.cards import random_nllb_cards
from specbeam.paths import SHIPPED
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead, HeadArch

TEXTS = [
    "En el principio crió Dios los cielos y la tierra.",
    "Y dijo Dios: Sea la luz.",
    "Yo soy el rey sobre Israel.",
]


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    card_dir = tmp_path_factory.mktemp("dense_600m") / "cards"
    random_nllb_cards(card_dir, "dense_600m_random", "dense_600m", "bible_es_en_target", HeadArch())
    return card_dir


def _build(cards: Path, *overrides: str) -> tuple:
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose(
            "translate",
            overrides=[
                "hardware.threads=2", f"model.asset_dirs=[{cards}]",
                "model.target=dense_600m_random", "model.draft=dense_600m_random_head",
                "decoding.max_gen_len=[0,6]", *overrides,
            ],
        )  # fmt: skip
    return run_app(lambda c: c.build(), cfg)


def _hypotheses(generator: Seq2SeqGenerator, tokenizer: Tokenizer) -> list[list[tuple]]:
    """Every source's beam hypotheses as (tokens, score), one batch of all sources."""
    seen: list[list[tuple]] = []

    def keep(_: list[int], out: SequenceGeneratorOutput) -> None:
        seen.extend([(h.seq.tolist(), float(h.score)) for h in hyps] for hyps in out.hypotheses)

    translate_nbest(generator, tokenizer, TEXTS, "spa_Latn", "eng_Latn", nbest=5, on_batch=keep)
    return seen


def test_spec_beam_is_beam_search_on_dense_600m(cards: Path) -> None:
    """All five hypotheses of every source, token for token, scores within float noise."""
    tokenizer, beam = _build(cards, "decoding=beam")
    assert beam.model.model_dim == 1024 and len(beam.model.decoder.layers) == 12
    want = _hypotheses(beam, tokenizer)
    del beam
    _, spec = _build(cards, "decoding=spec_beam", "decoding.plan=false", "decoding.gamma=2")
    assert isinstance(spec, SpeculativeBeamSearchSeq2SeqGenerator)
    assert isinstance(spec._draft_model, DraftHead)
    got = _hypotheses(spec, tokenizer)
    assert [[seq for seq, _ in hyps] for hyps in got] == [[seq for seq, _ in hyps] for hyps in want]
    assert all(len(hyps) == 5 and len(hyps[0][0]) > 3 for hyps in got)
    for hyps, expected in zip(got, want, strict=True):
        for (_, score), (_, wanted) in zip(hyps, expected, strict=True):
            assert score == pytest.approx(wanted, abs=1e-4)
