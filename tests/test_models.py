"""Model building, checkpoints, pairs."""

from __future__ import annotations

import copy

import pytest
import torch

from specbeam.models import (
    ModelArch,
    build_model,
    build_shallow_draft,
    cast_draft,
    check_same_vocabulary,
    load_model,
    num_parameters,
    save_model,
)
from tests.conftest import DRAFT_ARCH, TARGET_ARCH


def test_checkpoint_round_trip(tmp_path) -> None:
    model = build_model(TARGET_ARCH).eval()
    save_model(model, TARGET_ARCH, tmp_path / "m.pt", torch.float32)
    loaded = load_model(tmp_path / "m.pt")
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_shallow_draft_shares_the_target_encoder(tiny_target) -> None:
    target = copy.deepcopy(tiny_target)
    draft = build_shallow_draft(target, DRAFT_ARCH)
    assert draft.encoder is target.encoder and draft.encoder_frontend is target.encoder_frontend
    own = (
        num_parameters(draft)
        - num_parameters(target.encoder)
        - num_parameters(target.encoder_frontend)
    )
    assert own < num_parameters(build_model(DRAFT_ARCH))  # no encoder weights of its own
    check_same_vocabulary(target, draft)
    cast_draft(draft, target, torch.bfloat16)
    assert next(draft.decoder.parameters()).dtype == torch.bfloat16
    assert next(target.encoder.parameters()).dtype == torch.float32  # verification stays fp32


def test_mismatched_vocabulary_is_refused(tiny_target) -> None:
    other = build_model(ModelArch(**{**DRAFT_ARCH.__dict__, "vocab_size": 50}))
    with pytest.raises(
        ValueError,
        match=r"draft vocabulary \(50 entries\) differs from the target's \(48 entries\)",
    ):
        check_same_vocabulary(tiny_target, other)
