"""The `transformer` model family: a standard text encoder–decoder (Vaswani et al.) of
fairseq2's building blocks, for translation models that are not NLLB's.

fairseq2 0.8.1 registers no family for it (`nllb` is its only text encoder–decoder), so
specbeam's extension registers this one in every process: a card with
`model_family: transformer` then loads through fairseq2's model hub like any other. It
is NLLB's architecture with the norm order a setting (post-norm by default, as in the
paper and fairseq's `transformer` architectures) and without NLLB's legacy position offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fairseq2.composition import register_model_family
from fairseq2.models.nllb import NllbConfig, NllbFactory
from fairseq2.models.transformer import (
    StandardTransformerDecoder,
    StandardTransformerDecoderLayer,
    StandardTransformerEncoder,
    StandardTransformerEncoderLayer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    TransformerModel,
    TransformerNormOrder,
)
from fairseq2.nn import LayerNorm, PositionEncoder, SinusoidalPositionEncoder
from fairseq2.runtime.config_registry import ConfigRegistrar
from fairseq2.runtime.dependency import DependencyContainer

TRANSFORMER_FAMILY: Final = "transformer"


@dataclass(kw_only=True)
class TransformerConfig(NllbConfig):
    """NLLB's settings, at the base sizes of the paper, plus the norm order."""

    model_dim: int = 512
    vocab_size: int = 32_000
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    num_encoder_attn_heads: int = 8
    num_decoder_attn_heads: int = 8
    ffn_inner_dim: int = 2048
    norm_order: str = "post"
    """`post` (layer norm after each residual, as in the paper) or `pre`."""


class _TransformerFactory(NllbFactory):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config)
        try:
            self._order = TransformerNormOrder[config.norm_order.upper()]
        except KeyError:
            raise ValueError(
                f"model_config.norm_order={config.norm_order} is invalid: allowed: post, pre"
            ) from None

    def create_position_encoder(self) -> PositionEncoder:
        return SinusoidalPositionEncoder(self._config.model_dim, self._config.max_seq_len)

    def create_encoder(self) -> TransformerEncoder:
        layers = [self.create_encoder_layer() for _ in range(self._config.num_encoder_layers)]
        return StandardTransformerEncoder(layers, self._final_norm())

    def create_decoder(self) -> TransformerDecoder:
        layers = [self.create_decoder_layer() for _ in range(self._config.num_decoder_layers)]
        return StandardTransformerDecoder(layers, self._final_norm())

    def _final_norm(self) -> LayerNorm | None:
        """A post-norm stack ends normalised already."""
        return self.create_layer_norm() if self._order == TransformerNormOrder.PRE else None

    def create_encoder_layer(self) -> TransformerEncoderLayer:
        return StandardTransformerEncoderLayer(
            self.create_encoder_self_attention(), self.create_layer_norm(),
            self.create_ffn(), self.create_layer_norm(),
            norm_order=self._order, dropout_p=self._config.dropout_p,
        )  # fmt: skip

    def create_decoder_layer(self) -> TransformerDecoderLayer:
        return StandardTransformerDecoderLayer(
            self.create_decoder_self_attention(), self.create_layer_norm(),
            self.create_encoder_decoder_attention(), self.create_layer_norm(),
            self.create_ffn(), self.create_layer_norm(),
            norm_order=self._order, dropout_p=self._config.dropout_p,
        )  # fmt: skip


def create_transformer_model(config: TransformerConfig) -> TransformerModel:
    return _TransformerFactory(config).create_model()


def convert_transformer_state_dict(
    state_dict: dict[str, object], config: TransformerConfig
) -> dict[str, object]:
    """A fairseq2 state dict, bare or under `model` (as fairseq2's trainers and
    specbeam's `save_model` store it)."""
    model = state_dict.get("model", state_dict)
    assert isinstance(model, dict)
    return model


def register_transformer_family(container: DependencyContainer) -> None:
    register_model_family(
        container,
        TRANSFORMER_FAMILY,
        kls=TransformerModel,
        config_kls=TransformerConfig,
        factory=create_transformer_model,
        state_dict_converter=convert_transformer_state_dict,
    )
    arch = ConfigRegistrar(container, TransformerConfig)

    @arch("base")
    def base() -> TransformerConfig:
        return TransformerConfig()

    @arch("big")
    def big() -> TransformerConfig:
        return TransformerConfig(
            model_dim=1024, num_encoder_attn_heads=16, num_decoder_attn_heads=16,
            ffn_inner_dim=4096, dropout_p=0.3,
        )  # fmt: skip
