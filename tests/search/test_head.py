"""Draft heads: what they own, what they share with the target, and their checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
from fairseq2.nn import Projection

from specbeam.integration.cards import DRAFT_HEAD_FAMILY, model_card
from specbeam.integration.models import (
    ModelPairConfig,
    cast_draft,
    load_model,
    load_pair,
    save_head,
    save_model,
)
from specbeam.kernels import quant
from specbeam.search.head import DraftHead, HeadArch
from tests.conftest import TARGET_ARCH


def test_a_head_shares_the_targets_modules_and_owns_its_layers(tiny_target) -> None:
    target = copy.deepcopy(tiny_target)
    head = DraftHead(target, HeadArch(num_layers=2))
    assert head.encoder is target.encoder and head.final_proj is target.final_proj
    assert head.decoder.layer_norm is target.decoder.layer_norm
    # Initialised from the target's last layers, but copies: training moves only them.
    last = target.decoder.layers[-1].ffn.inner_proj.weight
    assert torch.equal(head.decoder.layers[-1].ffn.inner_proj.weight, last)
    assert head.decoder.layers[-1].ffn.inner_proj.weight is not last
    own = head.own_state_dict()
    assert all(k.startswith(("feature_proj.", "decoder.layers.")) for k in own)
    assert head.fuse is None  # the final state alone
    assert sum(v.numel() for v in own.values()) == sum(p.numel() for p in head.own_parameters())


def test_casting_copies_the_shared_modules_and_keeps_the_target_fp32(tiny_target) -> None:
    target = copy.deepcopy(tiny_target)
    head = cast_draft(DraftHead(target, HeadArch(num_layers=1)), target, torch.bfloat16)
    assert head.final_proj.weight.dtype == torch.bfloat16
    assert head.decoder.layer_norm.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in target.parameters())
    # The tied embedding and projection stay one tensor in the copy.
    assert head.final_proj.weight is head.decoder_frontend.embed.weight


def test_an_int8_head_quantizes_its_own_products_and_a_copy_of_the_projection(tiny_target):
    target = copy.deepcopy(tiny_target)
    head = DraftHead(target, HeadArch(num_layers=1)).quantize("int8")
    own = [m for m in head.decoder.layers.modules() if isinstance(m, Projection)]
    assert own and all(quant.precision_of(m) == "int8" for m in [*own, head.feature_proj])
    assert quant.precision_of(head.final_proj) == "int8"
    assert not any(isinstance(m, quant.QuantizedLinear) for m in target.modules())
    assert head.final_proj.weight is head.decoder_frontend.embed.weight  # still tied
    assert head.own_state_dict().keys() == DraftHead(target, HeadArch()).own_state_dict().keys()
    head.vocab = torch.tensor([7, 1, 5, 9, 2, 4])
    ranked, proj = head.draft_projection(4, (1,))
    assert quant.precision_of(proj) == "int8"
    assert torch.equal(proj.weight, head.final_proj.weight[ranked])
    # Over a quantized target (`target_dtype=int8`): the same.
    quant.quantize(target, "int8")
    head = DraftHead(target, HeadArch(num_layers=1)).quantize("int8")
    assert head.final_proj is not target.final_proj
    assert quant.precision_of(head.final_proj) == "int8"


def test_bad_sizes_are_refused(tiny_target) -> None:
    with pytest.raises(ValueError, match="1 to 2 layers"):
        DraftHead(tiny_target, HeadArch(num_layers=3))
    for layers in ((1,), (-1,), (0, 0)):  # the last layer is the final state already
        with pytest.raises(ValueError, match="distinct layers 0 to 0"):
            DraftHead(tiny_target, HeadArch(feature_layers=layers))


def test_a_head_over_several_layers_starts_as_the_choice_of_the_final_state(tiny_target) -> None:
    head = DraftHead(copy.deepcopy(tiny_target), HeadArch(feature_layers=(0,)))
    assert head.fuse is not None and "fuse.weight" in head.own_state_dict()
    lower, final = torch.randn(3, 5, 64), torch.randn(3, 5, 64)
    fused = head.fuse_features(torch.cat([lower, final], -1))
    torch.testing.assert_close(fused, final)
    # No bias: the prompt's zero states stay zero.
    assert torch.equal(head.fuse_features(torch.zeros(2, 128)), torch.zeros(2, 64))


def test_a_head_over_several_layers_round_trips(tmp_path, tiny_target) -> None:
    target = copy.deepcopy(tiny_target)
    head = DraftHead(target, HeadArch(num_layers=1, feature_layers=(0,)))
    torch.nn.init.normal_(head.fuse.weight)
    save_model(target, TARGET_ARCH, tmp_path / "target.pt", torch.float32)
    save_head(head, tmp_path / "head.pt", torch.float32)
    pair = ModelPairConfig(target=str(tmp_path / "target.pt"), draft=str(tmp_path / "head.pt"))
    _, loaded = load_pair(pair, TARGET_ARCH.vocab_size, with_draft=True)
    assert loaded.feature_layers == (0,)
    assert torch.equal(loaded.fuse.weight, head.fuse.weight)


def test_checkpoint_round_trip_and_card(tmp_path, tiny_target) -> None:
    target = copy.deepcopy(tiny_target)
    head = DraftHead(target, HeadArch(num_layers=1))
    torch.nn.init.normal_(head.feature_proj.weight)
    save_model(target, TARGET_ARCH, tmp_path / "target.pt", torch.float32)
    save_head(head, tmp_path / "head.pt", torch.float32)
    pair = ModelPairConfig(target=str(tmp_path / "target.pt"), draft=str(tmp_path / "head.pt"))
    loaded_target, loaded = load_pair(pair, TARGET_ARCH.vocab_size, with_draft=True)
    assert isinstance(loaded, DraftHead) and loaded.encoder is loaded_target.encoder
    for k, v in head.own_state_dict().items():
        assert torch.equal(loaded.own_state_dict()[k], v)
    card = model_card("head", tmp_path / "head.pt", tmp_path)
    assert card["model_family"] == DRAFT_HEAD_FAMILY and card["model_config"] == {
        "num_layers": 1,
        "feature_layers": [],
    }
    with pytest.raises(ValueError, match="draft head"):
        load_model(tmp_path / "head.pt")  # a head needs its target


def test_a_head_checkpoint_whose_arch_no_head_takes_is_named_in_one_line(
    tmp_path, tiny_target
) -> None:
    save_head(DraftHead(tiny_target, HeadArch(num_layers=1)), tmp_path / "head.pt", torch.float32)
    ckpt = torch.load(tmp_path / "head.pt", weights_only=True)
    ckpt["arch"]["draft_depth"] = 3  # a newer head's setting
    torch.save(ckpt, tmp_path / "newer.pt")
    with pytest.raises(ValueError) as error:
        load_model(tmp_path / "newer.pt", target=tiny_target)
    assert str(error.value) == (
        f"{tmp_path / 'newer.pt'}: its `arch` has settings specbeam's models do not take: "
        "draft_depth (they take feature_layers, num_layers)"
    )


def test_a_head_for_another_target_is_refused(tmp_path, tiny_target) -> None:
    save_head(DraftHead(tiny_target, HeadArch(num_layers=2)), tmp_path / "head.pt", torch.float32)
    other = copy.deepcopy(tiny_target)
    other.decoder.layers = other.decoder.layers[:1]
    with pytest.raises(ValueError, match="1 to 1 layers"):
        load_model(tmp_path / "head.pt", target=other)


def test_the_vocabulary_ranking_survives_the_checkpoint_and_picks_projection_rows(
    tmp_path, tiny_target
) -> None:
    target = copy.deepcopy(tiny_target)
    head = DraftHead(target, HeadArch(num_layers=1))
    with pytest.raises(ValueError, match="ranked vocabulary"):
        head.draft_projection(4, (1,))
    head.vocab = torch.tensor([7, 1, 5, 9, 2, 4])
    save_model(target, TARGET_ARCH, tmp_path / "target.pt", torch.float32)
    save_head(head, tmp_path / "head.pt", torch.float32)
    pair = ModelPairConfig(target=str(tmp_path / "target.pt"), draft=str(tmp_path / "head.pt"))
    _, loaded = load_pair(pair, TARGET_ARCH.vocab_size, with_draft=True)
    assert loaded.vocab.tolist() == [7, 1, 5, 9, 2, 4]
    ids, proj = loaded.draft_projection(4, (1, 9))  # most frequent 4, but 1 and 9
    assert ids.tolist() == [7, 5, 2, 4]
    assert torch.equal(proj.weight, loaded.final_proj.weight[[7, 5, 2, 4]])
    assert loaded.draft_projection(4, (1, 9))[1] is proj  # packed once, not per call
