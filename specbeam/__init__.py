"""Exact speculative beam search for fairseq2 translation models."""

from specbeam.generator import SpeculativeBeamSearchSeq2SeqGenerator, SpeculativeGeneratorOutput
from specbeam.stats import SpecStats

__all__ = ["SpeculativeBeamSearchSeq2SeqGenerator", "SpeculativeGeneratorOutput", "SpecStats"]
