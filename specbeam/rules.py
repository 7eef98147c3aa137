"""fairseq2's per-step scoring rules, for sources that sit at different steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from fairseq2.generation.step_processor import StepProcessor
from torch import Tensor
from torch.nn.functional import log_softmax


@dataclass(frozen=True)
class ScoringRules:
    """Mirrors `_AbstractBeamSearchSequenceGeneratorOp._step` of fairseq2 0.8.1."""

    eos_idx: int
    pad_idx: int | None
    unk_idx: int | None
    unk_penalty: float
    temperature: float
    min_seq_len: int
    max_seq_len: int
    step_processors: Sequence[StepProcessor] = ()

    def log_probs(self, logits: Tensor) -> Tensor:
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return log_softmax(logits, dim=-1, dtype=torch.float32)

    def apply(self, lprobs: Tensor, step_nr: Tensor, seqs: Tensor) -> None:
        """Edits lprobs (S, n, V) in place for sources at sequence index step_nr (S,).

        seqs (S, n, L) holds the hypotheses' tokens, for step processors.
        """
        eos = self.eos_idx
        forced = step_nr == self.max_seq_len - 1
        if forced.any():
            eos_lprobs = lprobs[forced, :, eos]
            lprobs[forced] = -torch.inf
            lprobs[forced, :, eos] = eos_lprobs
        free = ~forced
        if self.step_processors:
            self._run_processors(lprobs, step_nr, seqs, free)
        if self.unk_idx is not None:
            lprobs[free, :, self.unk_idx] -= self.unk_penalty
        if self.pad_idx is not None:
            lprobs[free, :, self.pad_idx] = -torch.inf
        lprobs[free & (step_nr < self.min_seq_len - 1), :, eos] = -torch.inf

    def _run_processors(self, lprobs: Tensor, step_nr: Tensor, seqs: Tensor, free: Tensor) -> None:
        """Processors see (N, step_nr) rows, so sources are grouped by their step."""
        for t in step_nr[free].unique().tolist():
            rows = free & (step_nr == t)
            group = lprobs[rows].flatten(0, 1)  # (rows * n, V)
            for processor in self.step_processors:
                processor(seqs[rows, :, :t].flatten(0, 1), group, lprob=True)
            lprobs[rows] = group.view(-1, lprobs.size(1), lprobs.size(2))
