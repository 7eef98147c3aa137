"""specbeam/search/checks.py: misuse of the generators' API is one sentence before any
decoding (it failed deep in a call, or decoded quietly wrong)."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
from fairseq2.generation.sampling import TopKSampler
from fairseq2.nn import BatchLayout

from specbeam.integration.models import build_model
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead, HeadArch
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator
from tests.conftest import DRAFT_ARCH, TARGET_ARCH, sources


def _batch(n: int) -> tuple:
    src = torch.nn.utils.rnn.pad_sequence(sources(0, n), batch_first=True) if n else torch.zeros((0, 4), dtype=torch.int64)  # fmt: skip
    prompts = torch.full((n, 1), 3, dtype=torch.int64)
    return src, BatchLayout.of(src), prompts, BatchLayout.of(prompts)


def test_a_draft_of_another_vocabulary_is_refused_at_construction(tiny_target, vocab_info) -> None:
    other = build_model(dataclasses.replace(DRAFT_ARCH, vocab_size=vocab_info.size + 16))
    with pytest.raises(ValueError) as error:
        SpeculativeBeamSearchSeq2SeqGenerator(tiny_target, other, vocab_info)
    assert str(error.value) == (
        f"draft vocabulary ({vocab_info.size + 16} entries) differs from the target's "
        f"({vocab_info.size} entries)"
    )


def test_a_head_over_a_target_of_another_width_is_refused(tiny_target, vocab_info) -> None:
    narrow = build_model(dataclasses.replace(TARGET_ARCH, model_dim=32, num_attn_heads=2))
    head = DraftHead(narrow, HeadArch(num_layers=1))
    with pytest.raises(ValueError, match=r"^the draft head was built over a target of width 32, not this target's 64$"):  # fmt: skip
        SpeculativeBeamSearchSeq2SeqGenerator(tiny_target, head, vocab_info)


def test_a_model_put_back_in_training_mode_is_refused_at_the_call(
    tiny_target, tiny_draft, vocab_info
) -> None:
    """Dropout would make every pass random; the constructor set eval mode, a caller
    switched it back."""
    target = copy.deepcopy(tiny_target)
    gen = SpeculativeBeamSearchSeq2SeqGenerator(target, tiny_draft, vocab_info)
    target.train()
    with pytest.raises(ValueError, match=r"^the target model is in training mode \(dropout on\)"):
        gen(*_batch(2))
    target.eval()
    gen(*_batch(2))


@pytest.mark.parametrize("sampling", [False, True])
def test_an_empty_batch_and_unpaired_prompts_are_named(
    tiny_target, tiny_draft, vocab_info, sampling: bool
) -> None:
    gen = (
        SpeculativeSamplingSeq2SeqGenerator(tiny_target, tiny_draft, vocab_info, TopKSampler(8))
        if sampling
        else SpeculativeBeamSearchSeq2SeqGenerator(tiny_target, tiny_draft, vocab_info)
    )
    with pytest.raises(ValueError, match=r"^the batch is empty: no source sequences to decode$"):
        gen(*_batch(0))
    src, src_layout, prompts, _ = _batch(3)
    with pytest.raises(
        ValueError, match=r"^3 source sequences but 2 prompts: one prompt per source$"
    ):
        gen(src, src_layout, prompts[:2], BatchLayout.of(prompts[:2]))


def test_a_beam_as_wide_as_the_vocabulary_is_refused(tiny_target, vocab_info) -> None:
    with pytest.raises(
        ValueError, match=rf"^beam_size={vocab_info.size} is invalid: must be below"
    ):
        SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, None, vocab_info, beam_size=vocab_info.size
        )


def test_a_half_precision_target_is_warned_of(tiny_target, vocab_info, caplog) -> None:
    """Its sums depend on how many rows a product computes: not exact, said once."""
    half = copy.deepcopy(tiny_target).to(torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="specbeam.search.checks"):
        SpeculativeBeamSearchSeq2SeqGenerator(half, None, vocab_info)
        SpeculativeBeamSearchSeq2SeqGenerator(tiny_target, None, vocab_info)
    (record,) = caplog.records
    assert record.getMessage().startswith(
        "the target's parameters are torch.bfloat16: the output is exact"
    )
