"""Counters of a speculative generation call: passes, τ, acceptance, cache bytes, time."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from fairseq2.generation import SequenceGeneratorOutput
from torch import Tensor


@dataclass
class SpecStats:
    target_passes: int = 0
    draft_passes: int = 0  # draft decoder calls
    source_passes: int = 0  # (pass, unfinished source) pairs
    steps: int = 0  # beam-search steps, summed over sources
    drafted_tokens: int = 0
    verified_slots: int = 0  # query tokens the verification calls computed (padding packed away)
    accepted_tokens: int = 0
    plain_sources: int = 0  # decoded by plain beam search (batch above max_speculative_sources)
    tau_histogram: Counter[int] = field(default_factory=Counter)
    peak_target_cache_bytes: int = 0
    peak_draft_cache_bytes: int = 0
    seconds: dict[str, float] = field(
        default_factory=lambda: {"draft": 0.0, "verify": 0.0, "accept": 0.0, "commit": 0.0}
    )
    passes_per_source: list[int] = field(default_factory=list)  # by the caller's batch index
    steps_per_source: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        """Beam-search steps advanced per verification pass, per source."""
        return self.steps / max(self.source_passes, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / max(self.drafted_tokens, 1)

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.seconds[phase] += time.perf_counter() - started

    def record_pass(
        self, source_ids: Tensor, steps: Tensor, drafted: Tensor, accepted: Tensor
    ) -> None:
        """Per-source tensors (S,) of one verification pass."""
        for i, n in zip(source_ids.tolist(), steps.tolist(), strict=True):
            self.passes_per_source[i] += 1
            self.steps_per_source[i] += n
        self.target_passes += 1
        self.source_passes += len(steps)
        self.steps += int(steps.sum())
        self.drafted_tokens += int(drafted.sum())
        self.accepted_tokens += int(accepted.sum())
        self.tau_histogram.update(steps.tolist())

    def merge(self, other: SpecStats) -> None:
        for name in (
            "target_passes",
            "draft_passes",
            "source_passes",
            "steps",
            "drafted_tokens",
            "verified_slots",
            "accepted_tokens",
            "plain_sources",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.tau_histogram.update(other.tau_histogram)
        self.peak_target_cache_bytes = max(
            self.peak_target_cache_bytes, other.peak_target_cache_bytes
        )
        self.peak_draft_cache_bytes = max(self.peak_draft_cache_bytes, other.peak_draft_cache_bytes)
        for phase, seconds in other.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def to_dict(self) -> dict:
        out = asdict(self)
        out["tau_histogram"] = dict(sorted(self.tau_histogram.items()))
        out["tau"] = self.tau
        out["acceptance_rate"] = self.acceptance_rate
        return out


@dataclass
class SpeculativeGeneratorOutput(SequenceGeneratorOutput):
    """fairseq2's output of a generation call, with the call's `SpecStats`."""

    stats: SpecStats = field(default_factory=SpecStats)
