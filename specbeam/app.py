"""What specbeam's Hydra apps share: the settings of a translation pipeline, building it,
and turning bad settings into one-line errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator
from omegaconf import DictConfig, OmegaConf

from specbeam.decoding import DecodingConfig, make_generator
from specbeam.hardware import HardwareConfig
from specbeam.models import ModelPairConfig, load_pair
from specbeam.task import TaskConfig

R = TypeVar("R")


@dataclass(kw_only=True)
class PipelineConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)

    def build(self) -> tuple[Tokenizer, Seq2SeqGenerator]:
        self.hardware.apply()
        self.decoding.validate()
        tokenizer = self.task.load_tokenizer()
        target, draft = load_pair(
            self.model, tokenizer.vocab_info.size, with_draft=self.decoding.speculative,
            draft_dtype=self.hardware.draft_torch_dtype,
        )  # fmt: skip
        return tokenizer, make_generator(self.decoding, target, draft, tokenizer.vocab_info)


def run_app(app: Callable[[Any], R], cfg: DictConfig) -> R:
    """Runs an app on its structured config; a bad setting or a missing file ends the
    process with one line naming the problem, not a traceback."""
    try:
        return app(OmegaConf.to_object(cfg))
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
