"""The vocabulary ranking a head drafts from (FR-Spec)."""

from __future__ import annotations

import torch

from specbeam.training.vocab import ranked_tokens


def test_tokens_rank_by_frequency_then_id() -> None:
    encode = {"a": torch.tensor([5, 3, 5]), "b": torch.tensor([3, 9, 5]), "c": torch.tensor([9])}
    ranked = ranked_tokens(["a", "b", "c"], encode.__getitem__)
    assert ranked.tolist() == [5, 3, 9]  # 5 three times; 3 and 9 twice each, lower id first
    assert ranked.dtype == torch.int64
