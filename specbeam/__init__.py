"""Exact speculative beam search for fairseq2 translation models."""

from specbeam.search.config import MachineSettings, SearchSettings, SpeculativeSearchConfig
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput

__all__ = [
    "MachineSettings",
    "SearchSettings",
    "SpecStats",
    "SpeculativeBeamSearchSeq2SeqGenerator",
    "SpeculativeGeneratorOutput",
    "SpeculativeSearchConfig",
]
