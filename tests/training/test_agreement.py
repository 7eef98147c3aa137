"""Teacher-forced agreement between a draft and its target."""

from __future__ import annotations

import pytest
import torch

from specbeam.data.tokens import TokenizedPair
from specbeam.search.head import DraftHead, HeadArch
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


def test_a_head_over_several_layers_reads_them_from_the_target(tiny_target, tiny_head) -> None:
    """Widened with a fusion that picks the final state, a head agrees as before; with
    the lower layer weighed in, otherwise."""
    wider = DraftHead(tiny_target, HeadArch(num_layers=1, feature_layers=(0,))).eval()
    wider.load_state_dict(tiny_head.own_state_dict(), strict=False)
    data = pairs(40)
    options = dict(pad_idx=0, k=2, width=4, prompt_len=1)
    base = measure_agreement(tiny_target, tiny_head, data, **options)
    assert measure_agreement(tiny_target, wider, data, **options) == base
    with torch.no_grad():
        wider.fuse.weight[:, :64] = torch.eye(64)  # the lower layer's output added in
    assert measure_agreement(tiny_target, wider, data, **options) != base
