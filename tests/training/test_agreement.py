"""Teacher-forced agreement between a draft and its target."""

from __future__ import annotations

import pytest
import torch

from specbeam.apps.data import TokenizedPair
from specbeam.training.agreement import measure_agreement
from tests.conftest import synthetic_pair


def pairs(n: int) -> list[TokenizedPair]:
    gen = torch.Generator().manual_seed(7)
    return [TokenizedPair(*synthetic_pair(gen)) for _ in range(n)]


def test_a_copy_of_the_target_agrees_everywhere(tiny_target, copy_draft) -> None:
    data = pairs(12)
    a = measure_agreement(tiny_target, copy_draft, data, pad_idx=0, k=4, width=4)
    assert a.positions == sum(len(p.target) - 1 for p in data)
    assert (a.top1, a.topk_covered) == (1.0, 1.0)


def test_weaker_drafts_agree_less_and_a_wider_top_covers_more(
    tiny_target, tiny_draft, untrained_draft
) -> None:
    data = pairs(40)
    trained = measure_agreement(tiny_target, tiny_draft, data, pad_idx=0, k=2, width=2)
    untrained = measure_agreement(tiny_target, untrained_draft, data, pad_idx=0, k=2, width=2)
    assert untrained.top1 < trained.top1 < 1.0
    wider = measure_agreement(tiny_target, tiny_draft, data, pad_idx=0, k=2, width=8)
    assert trained.topk_covered < wider.topk_covered
    # Batches of a few tokens give the same counts as one batch.
    small = measure_agreement(tiny_target, tiny_draft, data, pad_idx=0, k=2, width=2, max_tokens=40)
    assert small == trained


def test_k_1_and_width_1_coverage_is_top1(tiny_target, tiny_draft) -> None:
    a = measure_agreement(tiny_target, tiny_draft, pairs(20), pad_idx=0, k=1, width=1)
    assert a.topk_covered == a.top1


def test_heads_agree_from_the_targets_states(tiny_target, tiny_head, untrained_head) -> None:
    data = pairs(40)
    trained = measure_agreement(tiny_target, tiny_head, data, pad_idx=0, k=2, width=4, prompt_len=1)
    untrained = measure_agreement(
        tiny_target, untrained_head, data, pad_idx=0, k=2, width=4, prompt_len=1
    )
    assert trained.positions == sum(len(p.target) - 1 for p in data)
    assert untrained.top1 < trained.top1 and untrained.topk_covered < trained.topk_covered
    with pytest.raises(ValueError, match="prompt length"):
        measure_agreement(tiny_target, tiny_head, data, pad_idx=0)
