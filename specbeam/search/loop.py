"""The loop both speculative generators run (docs/design.md, "The loop"): the draft proposes a
tree, the target verifies it in one call, acceptance decides what each row keeps, both
caches commit it, and finished rows leave. Beam search (`generator._Op`) and sampling
(`sampling._SampleOp`) supply only what differs: the draft's inputs, the acceptance rule,
and what a finished row leaves in the output."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Generic, Protocol, TypeVar

import torch
from fairseq2.generation import GenerationCounters, Hypothesis
from torch import Tensor

from specbeam.search.accept import Acceptance
from specbeam.search.draft import Drafter
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput
from specbeam.search.tree import DraftTree
from specbeam.search.verify import Verification, Verifier


class LoopState(Protocol):
    """What the loop reads of a generator's per-row state."""

    step_nr: Tensor  # (S,) sequence index of each row's next token
    source_ids: Tensor  # (S,) each row's source in the caller's batch

    def select_sources(self, keep: Tensor) -> None: ...


State = TypeVar("State", bound=LoopState)


class SpeculativeLoop(ABC, Generic[State]):
    """One generation call's loop. A subclass sets these attributes in its `__init__`
    and supplies the steps that differ."""

    verifier: Verifier
    drafter: Drafter | None  # None: no draft, every pass verifies the roots alone
    state: State
    prompts: Tensor  # (S, P)
    output: list[list[Hypothesis]]  # per source of the caller's batch
    stats: SpecStats

    @property
    @abstractmethod
    def hyps_per_row(self) -> int:
        """Hypotheses each step of a row generates (fairseq2's `num_generated_elements`
        counts each)."""

    @abstractmethod
    def _propose(self, drafter: Drafter) -> DraftTree:
        """The draft's tree below every row's live hypotheses."""

    @abstractmethod
    def _score_prompt(self, verification: Verification) -> None:
        """fairseq2's prefill scores of the prompts, from the first pass."""

    @abstractmethod
    def _accept(self, verification: Verification, tree: DraftTree) -> Acceptance:
        """What each row keeps of the pass, written into the state."""

    @abstractmethod
    def _drop(self, done: Tensor) -> Tensor:
        """Moves what the finished rows (done (S,)) leave to the output; returns the rows
        that go on, `keep` for `select_sources`."""

    def __call__(self) -> SpeculativeGeneratorOutput:
        try:
            return self._run()
        finally:
            self.verifier.decoder.cache.release()
            if self.drafter is not None:
                self.drafter.decoder.cache.release()

    def _run(self) -> SpeculativeGeneratorOutput:
        started = time.perf_counter()
        state, stats, drafter, verifier = self.state, self.stats, self.drafter, self.verifier
        device = self.prompts.device
        chains = self.prompts[:, None, :]  # (S, 1, P): one pending chain per row
        chain_len = torch.full((len(chains),), chains.size(-1), dtype=torch.int64, device=device)
        first = True
        while len(state.step_nr) > 0:
            with stats.timed("draft"):
                tree = (
                    DraftTree.empty(len(chains), device)
                    if drafter is None
                    else self._propose(drafter)
                )
            with stats.timed("verify"):
                verification = verifier.verify(chains, chain_len, tree)
            with stats.timed("accept"):
                if first:
                    self._score_prompt(verification)
                    first = False
                acceptance = self._accept(verification, tree)
            with stats.timed("commit"):
                verifier.commit(verification, acceptance.origin, acceptance.node)
                if drafter is not None:
                    drafter.commit(
                        acceptance.origin, acceptance.node, acceptance.roots, tree, verification
                    )
                    drafter.adapt(acceptance.steps)
            stats.record_pass(
                state.source_ids, acceptance.steps, tree.num_nodes(), acceptance.accepted
            )
            stats.verified_slots += verification.computed_slots
            chains = acceptance.roots[..., None]
            chain_len = torch.ones(len(chains), dtype=torch.int64, device=device)
            if acceptance.done.any():
                keep = self._drop(acceptance.done)
                state.select_sources(keep)
                verifier.decoder.select_sources(keep)
                if drafter is not None:
                    drafter.select_sources(keep)
                chains = chains.index_select(0, keep)
                chain_len = chain_len.index_select(0, keep)
        stats.peak_target_cache_bytes = verifier.decoder.cache.peak_bytes
        if drafter is not None:
            stats.draft_passes = drafter.passes
            stats.peak_draft_cache_bytes = drafter.decoder.cache.peak_bytes
        # Counted as fairseq2 counts them: prompts of 2+ tokens are prefilled, and a step
        # generates one element per live hypothesis, one per source at the first step.
        num_sources, prompt_len = self.prompts.shape
        k = self.hyps_per_row
        counters = GenerationCounters(
            prefill_size=self.prompts.numel() if prompt_len > 1 else 0,
            num_generated_elements=stats.steps * k - (k - 1) * num_sources,
            generation_time=time.perf_counter() - started,
            cache_size=verifier.decoder.cache.bytes_held(),
            cache_capacity=stats.peak_target_cache_bytes,
        )
        return SpeculativeGeneratorOutput(self.output, counters, stats)
