"""The `transformer` model family: registered in every process, built from its card's
config by fairseq2's model hub (loading by card is tested in test_hub.py)."""

from __future__ import annotations

import pytest
from fairseq2.models.family import ModelFamily
from fairseq2.models.transformer import TransformerNormOrder
from fairseq2.runtime.dependency import get_dependency_resolver

from specbeam.integration.transformer import (
    TRANSFORMER_FAMILY,
    TransformerConfig,
    create_transformer_model,
)

TINY = dict(model_dim=32, vocab_size=40, num_encoder_layers=1, num_decoder_layers=1,
            num_encoder_attn_heads=2, num_decoder_attn_heads=2, ffn_inner_dim=64)  # fmt: skip


@pytest.mark.parametrize(("order", "final_norm"), [("post", False), ("pre", True)])
def test_norm_order_is_a_setting(order: str, final_norm: bool) -> None:
    model = create_transformer_model(TransformerConfig(**TINY, norm_order=order))
    layer = model.decoder.layers[0]
    assert layer.norm_order == TransformerNormOrder[order.upper()]
    assert (model.decoder.layer_norm is not None) == final_norm
    assert (model.encoder.layer_norm is not None) == final_norm


def test_a_bad_norm_order_is_named() -> None:
    with pytest.raises(
        ValueError, match="model_config.norm_order=side is invalid: allowed: post, pre"
    ):
        create_transformer_model(TransformerConfig(**TINY, norm_order="side"))


def test_the_family_and_its_archs_are_registered() -> None:
    family = get_dependency_resolver().resolve(ModelFamily, key=TRANSFORMER_FAMILY)
    assert family.get_archs() >= {"base", "big"}
    assert family.maybe_get_arch_config("base") == TransformerConfig()
