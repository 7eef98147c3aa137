"""Beam-search state of every unfinished source, with sources at different steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from fairseq2.generation import Hypothesis
from torch import Tensor


@dataclass
class BeamState:
    seqs: Tensor  # (S, k, L) tokens, prompt included
    step_scores: Tensor  # (S, k, L) cumulative scores, as fairseq2 keeps them
    scores: Tensor  # (S, n) cumulative score of each live hypothesis
    step_nr: Tensor  # (S,) sequence index of the next token
    n: int  # live hypotheses per source: 1 before the first step, then k
    source_ids: Tensor  # (S,) index of each row in the caller's batch

    @staticmethod
    def start(prompts: Tensor, beam_size: int, max_seq_len: int) -> BeamState:
        """prompts: (S, P)."""
        num_sources, prompt_len = prompts.shape
        device = prompts.device
        seqs = torch.zeros((num_sources, beam_size, max_seq_len), dtype=torch.int64, device=device)
        seqs[:, :, :prompt_len] = prompts[:, None, :]
        return BeamState(
            seqs=seqs,
            step_scores=torch.zeros((num_sources, beam_size, max_seq_len), device=device),
            scores=torch.zeros((num_sources, 1), device=device),
            step_nr=torch.full((num_sources,), prompt_len, dtype=torch.int64, device=device),
            n=1,
            source_ids=torch.arange(num_sources, device=device),
        )

    def select_sources(self, keep: Tensor) -> None:
        self.seqs = self.seqs.index_select(0, keep)
        self.step_scores = self.step_scores.index_select(0, keep)
        self.scores = self.scores.index_select(0, keep)
        self.step_nr = self.step_nr.index_select(0, keep)
        self.source_ids = self.source_ids.index_select(0, keep)


@dataclass(frozen=True)
class HypothesisFactory:
    """Builds finished hypotheses exactly as fairseq2's `_finish_sequence` does."""

    eos_idx: int
    prompt_len: int
    echo_prompt: bool
    normalize_scores: bool
    len_penalty: float

    def __call__(self, seq: Tensor, cum_scores: Tensor, score: Tensor, step_nr: int) -> Hypothesis:
        """seq, cum_scores: (L,) of the parent; the EOS lands at index step_nr."""
        start = 0 if self.echo_prompt else self.prompt_len
        eos = seq.new_full((1,), self.eos_idx)
        out_seq = torch.cat([seq[start:step_nr], eos])
        step_scores = torch.cat([cum_scores[start:step_nr], score.view(1)])
        step_scores[1:] = step_scores[1:] - step_scores[:-1]
        if self.normalize_scores:
            # fairseq2 normalises by the sequence length minus one, prompt included.
            score = score / step_nr**self.len_penalty
        return Hypothesis(out_seq, score, step_scores)
