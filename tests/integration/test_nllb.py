"""NLLB end to end: NLLB-architecture models, the NLLB tokenizer family (language tokens,
`[</s>, __lang__]` target prefix) and fairseq2's own `TextTranslator`, string in and out."""

from __future__ import annotations

import dataclasses

import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.generation.text import TextTranslator

from specbeam.integration.models import ModelPairConfig, build_model
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from tests.conftest import DRAFT_ARCH, TARGET_ARCH

SENTENCES = [
    "En el principio crió Dios los cielos y la tierra.",
    "Y dijo Dios: Sea la luz: y fué la luz.",
]


def test_text_translator_with_language_prefix_matches_beam_search() -> None:
    tokenizer = ModelPairConfig().load_tokenizer()  # NLLB family, langs spa_Latn and eng_Latn
    size = tokenizer.vocab_info.size
    torch.manual_seed(0)
    target = build_model(dataclasses.replace(TARGET_ARCH, vocab_size=size)).eval()
    draft = build_model(dataclasses.replace(DRAFT_ARCH, vocab_size=size)).eval()
    settings = dict(beam_size=4, max_gen_len=(0.5, 6))
    outputs = {}
    for name, generator in {
        "fairseq2": BeamSearchSeq2SeqGenerator(target, tokenizer.vocab_info, **settings),
        "specbeam": SpeculativeBeamSearchSeq2SeqGenerator(
            target, draft, tokenizer.vocab_info, gamma=3, **settings
        ),
    }.items():
        translator = TextTranslator(
            generator, tokenizer, source_lang="spa_Latn", target_lang="eng_Latn"
        )
        texts, results = translator.batch_translate(SENTENCES)
        outputs[name] = (texts, [[h.seq.tolist() for h in hyps] for hyps in results.hypotheses])
    assert outputs["specbeam"] == outputs["fairseq2"]
    assert all(isinstance(t, str) for t in outputs["specbeam"][0])
