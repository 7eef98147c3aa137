"""Exact speculative beam search for fairseq2 translation models."""

from specbeam.search.generator import (
    SpeculativeBeamSearchSeq2SeqGenerator,
    SpeculativeGeneratorOutput,
)
from specbeam.search.stats import SpecStats

__all__ = ["SpeculativeBeamSearchSeq2SeqGenerator", "SpeculativeGeneratorOutput", "SpecStats"]
