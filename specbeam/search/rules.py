"""fairseq2's per-step scoring rules, for sources that sit at different steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.error import NotSupportedError
from fairseq2.generation.step_processor import StepProcessor
from fairseq2.nn import BatchLayout
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

    @staticmethod
    def of(
        vocab: VocabularyInfo,
        *,
        unk_penalty: float,
        temperature: float,
        min_seq_len: int,
        max_seq_len: int,
        step_processors: Sequence[StepProcessor] = (),
    ) -> ScoringRules:
        """A generation call's rules over the target's vocabulary (its EOS is set: the
        generators check)."""
        assert vocab.eos_idx is not None
        return ScoringRules(
            eos_idx=vocab.eos_idx,
            pad_idx=vocab.pad_idx,
            unk_idx=vocab.unk_idx,
            unk_penalty=unk_penalty,
            temperature=temperature,
            min_seq_len=min_seq_len,
            max_seq_len=max_seq_len,
            step_processors=step_processors,
        )

    def log_probs(self, logits: Tensor) -> Tensor:
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return log_softmax(logits, dim=-1, dtype=torch.float32)

    def apply(self, lprobs: Tensor, step_nr: Tensor, seqs: Tensor | None = None) -> None:
        """Edits lprobs (S, n, V) in place for sources at sequence index step_nr (S,).

        seqs (S, n, L) holds the hypotheses' tokens; only step processors need them.
        """
        eos = self.eos_idx
        forced = step_nr == self.max_seq_len - 1
        if forced.any():
            eos_lprobs = lprobs[..., eos].clone()
            lprobs.masked_fill_(forced[:, None, None], -torch.inf)
            lprobs[..., eos] = eos_lprobs
        free = ~forced[:, None]  # (S, 1)
        if self.step_processors:
            if seqs is None:
                raise ValueError("step processors need the hypotheses' tokens (`seqs`)")
            self._run_processors(lprobs, step_nr, seqs, free[:, 0])
        # Column views edited in place: no boolean indexing of the (S, n, V) log-probs.
        if self.unk_idx is not None:
            lprobs[..., self.unk_idx].sub_(free * self.unk_penalty)
        if self.pad_idx is not None:
            lprobs[..., self.pad_idx].masked_fill_(free, -torch.inf)
        lprobs[..., eos].masked_fill_(free & (step_nr < self.min_seq_len - 1)[:, None], -torch.inf)

    def _run_processors(self, lprobs: Tensor, step_nr: Tensor, seqs: Tensor, free: Tensor) -> None:
        """Processors see (N, step_nr) rows, so sources are grouped by their step."""
        for t in step_nr[free].unique().tolist():
            rows = free & (step_nr == t)
            group = lprobs[rows].flatten(0, 1)  # (rows * n, V)
            for processor in self.step_processors:
                processor(seqs[rows, :, :t].flatten(0, 1), group, lprob=True)
            lprobs[rows] = group.view(-1, lprobs.size(1), lprobs.size(2))


def length_limits(
    source_layout: BatchLayout,
    prompt_layout: BatchLayout,
    max_gen_len: tuple[float, int],
    min_gen_len: int,
    max_seq_len: int,
) -> tuple[int, int, int]:
    """fairseq2's checks of one generation call, and its limits: (prompt length, minimum
    and maximum sequence length). Both limits come from the batch's longest source, as
    in fairseq2's beam search and sampling generators."""
    if source_layout.packed or prompt_layout.packed:
        raise ValueError("`source_seqs` and `prompt_seqs` must not be packed batches.")
    prompt_len = prompt_layout.max_seq_len
    if prompt_layout.min_seq_len != prompt_len:
        raise NotSupportedError("prompts of different lengths in one batch are not supported yet")
    if prompt_len >= max_seq_len:
        raise ValueError(f"prompt length must be < max_seq_len ({max_seq_len}), is {prompt_len}")
    a, b = max_gen_len
    gen_len = int(a * max(source_layout.seq_lens) + b)
    if gen_len < 1:
        raise ValueError(f"`max_gen_len` must be ≥ 1, but is {gen_len}. Adjust `max_gen_len`.")
    if min_gen_len > gen_len:
        raise ValueError(f"`min_gen_len` must be ≤ max_gen_len ({gen_len}), is {min_gen_len}.")
    limit = min(max_seq_len, prompt_len + gen_len)
    return prompt_len, min(limit, prompt_len + min_gen_len), limit
