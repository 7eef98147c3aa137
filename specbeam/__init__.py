"""Exact speculative beam search for fairseq2 translation models."""

from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput

__all__ = ["SpeculativeBeamSearchSeq2SeqGenerator", "SpeculativeGeneratorOutput", "SpecStats"]
