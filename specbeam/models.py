"""Builds NLLB-architecture fairseq2 models from small arch configs and saves/loads them."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from fairseq2.models.nllb import NllbConfig, create_nllb_model
from fairseq2.models.transformer import TransformerModel


@dataclass(kw_only=True)
class ModelArch:
    """The size of an NLLB-architecture model; everything else is NLLB's default."""

    model_dim: int = 512
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    num_attn_heads: int = 8
    ffn_inner_dim: int = 2048
    dropout_p: float = 0.1
    vocab_size: int = 8000
    pad_idx: int = 0
    max_seq_len: int = 1024

    def to_nllb_config(self) -> NllbConfig:
        return NllbConfig(
            model_dim=self.model_dim,
            max_seq_len=self.max_seq_len,
            vocab_size=self.vocab_size,
            pad_idx=self.pad_idx,
            num_encoder_layers=self.num_encoder_layers,
            num_decoder_layers=self.num_decoder_layers,
            num_encoder_attn_heads=self.num_attn_heads,
            num_decoder_attn_heads=self.num_attn_heads,
            ffn_inner_dim=self.ffn_inner_dim,
            dropout_p=self.dropout_p,
        )


def build_model(arch: ModelArch) -> TransformerModel:
    return create_nllb_model(arch.to_nllb_config())


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def atomic_save(obj: Any, path: Path) -> None:
    """A killed writer never leaves a truncated checkpoint behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def save_model(model: TransformerModel, arch: ModelArch, path: Path, dtype: torch.dtype) -> None:
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}
    atomic_save({"arch": asdict(arch), "model": state}, path)


def load_model(path: Path, dtype: torch.dtype = torch.float32) -> TransformerModel:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(ModelArch(**ckpt["arch"]))
    model.load_state_dict({k: v.to(dtype) for k, v in ckpt["model"].items()})
    return model.to(dtype).eval()
