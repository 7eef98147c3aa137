"""Decoding settings and the generator they build: plain fairseq2 or speculative."""

from __future__ import annotations

from dataclasses import dataclass, field

from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.models.seq2seq import Seq2SeqModel

from specbeam.generator import SpeculativeBeamSearchSeq2SeqGenerator


@dataclass(kw_only=True)
class DecodingConfig:
    name: str = "spec_beam"
    speculative: bool = True
    beam_size: int = 5
    gamma: int = 4
    draft_strategy: str = "beam"
    draft_width: int | None = None
    len_penalty: float = 1.0
    min_gen_len: int = 1
    max_gen_len: list[float] = field(default_factory=lambda: [1.5, 10])
    """a, b: at most a × (longest source in the batch) + b tokens."""
    unk_penalty: float = 0.0
    temperature: float = 1.0

    def validate(self) -> None:
        def bad(setting: str, value: object, allowed: str) -> ValueError:
            return ValueError(f"decoding.{setting}={value} is invalid: {allowed}")

        if self.beam_size < 1:
            raise bad("beam_size", self.beam_size, "must be ≥ 1")
        if self.speculative and self.gamma < 1:
            raise bad("gamma", self.gamma, "must be ≥ 1")
        if self.draft_strategy not in ("beam", "linear"):
            raise bad("draft_strategy", self.draft_strategy, "allowed: beam, linear")
        if self.draft_width is not None and self.draft_width < self.beam_size:
            raise bad(
                "draft_width", self.draft_width, f"must be ≥ beam_size ({self.beam_size}) or null"
            )
        if len(self.max_gen_len) != 2:
            raise bad("max_gen_len", self.max_gen_len, "expected [a, b]")


def make_generator(
    cfg: DecodingConfig,
    target: Seq2SeqModel,
    draft: Seq2SeqModel | None,
    vocab_info: VocabularyInfo,
    *,
    memory_budget_bytes: int | None = None,
) -> Seq2SeqGenerator:
    """`memory_budget_bytes` (hardware.memory_budget_mb) bounds speculative decoding only:
    fairseq2's beam search sizes its own cache."""
    cfg.validate()
    common = dict(
        beam_size=cfg.beam_size,
        len_penalty=cfg.len_penalty,
        min_gen_len=cfg.min_gen_len,
        max_gen_len=(float(cfg.max_gen_len[0]), int(cfg.max_gen_len[1])),
        unk_penalty=cfg.unk_penalty,
        temperature=cfg.temperature,
    )
    if not cfg.speculative:
        return BeamSearchSeq2SeqGenerator(target, vocab_info, **common)
    if draft is None:
        raise ValueError(f"decoding={cfg.name} is speculative but the model pair has no draft")
    return SpeculativeBeamSearchSeq2SeqGenerator(
        target, draft, vocab_info, gamma=cfg.gamma, draft_strategy=cfg.draft_strategy,  # type: ignore[arg-type]
        draft_width=cfg.draft_width, memory_budget_bytes=memory_budget_bytes, **common,
    )  # fmt: skip
