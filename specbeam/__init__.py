"""Exact speculative beam search for fairseq2 translation models."""

from specbeam.integration.models import LoadedPair, ModelPairConfig, open_pair
from specbeam.search.config import MachineSettings, SearchSettings, SpeculativeSearchConfig
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput

__all__ = [
    "LoadedPair",
    "ModelPairConfig",
    "open_pair",
    "MachineSettings",
    "SearchSettings",
    "SpecStats",
    "SpeculativeBeamSearchSeq2SeqGenerator",
    "SpeculativeGeneratorOutput",
    "SpeculativeSearchConfig",
]
