"""Exact speculative beam search as a fairseq2 `Seq2SeqGenerator`.

One loop (docs/design.md, "The loop"): the draft proposes a tree below every live
hypothesis, the target verifies all trees in one call, exact acceptance replays beam
search on the verified log-probs, and both caches keep the accepted paths.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Any, final

import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.error import NotSupportedError
from fairseq2.generation import (
    GenerationCounters,
    Seq2SeqGenerator,
    StepHook,
)
from fairseq2.generation.beam_search import (
    BeamSearchAlgorithm,
    BeamSearchSeq2SeqGenerator,
    StandardBeamSearchAlgorithm,
)
from fairseq2.generation.step_processor import StepProcessor
from fairseq2.models.seq2seq import Seq2SeqModel
from fairseq2.nn import BatchLayout
from torch import Tensor
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from specbeam.kernels import onednn
from specbeam.kernels.runtime import Runtime, in_own_runtime
from specbeam.search.accept import Acceptance, BeamAcceptor
from specbeam.search.beam import BeamState, HypothesisFactory
from specbeam.search.cache import surviving_rows
from specbeam.search.checks import check_call, check_pair
from specbeam.search.config import SpeculativeSearchConfig
from specbeam.search.draft import Drafter
from specbeam.search.head import DraftHead
from specbeam.search.loop import SpeculativeLoop
from specbeam.search.memory import (
    DecoderSize,
    cache_capacity,
    checked_increment,
    fit_budget,
    head_chain_len,
    source_bytes,
)
from specbeam.search.planner import PassShape, Planner
from specbeam.search.rules import ScoringRules, length_limits
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput
from specbeam.search.tree import DraftTree
from specbeam.search.tree_attention import TreeDecoder
from specbeam.search.verify import Verification, Verifier

log = logging.getLogger(__name__)


@final
class SpeculativeBeamSearchSeq2SeqGenerator(Seq2SeqGenerator):
    """fairseq2's `BeamSearchSeq2SeqGenerator` plus a draft model; same output.

    The draft is a decoder of its own (any fairseq2 `TransformerModel` over the same
    vocabulary) or a `DraftHead`, which drafts from the target's decoder states that each
    verification pass computes (`specbeam.search.head`). `config` holds every setting
    (`specbeam.search.config`); fairseq2's keyword arguments (`beam_size=5`) and the
    speculation's (`gamma=4`) replace its search settings by name. The draft tree's shape
    and the lean decoders change speed only; a relaxation (`relax_top`) changes the output.

    A call decodes plain beam search on the target alone when there is no draft, when it
    has more than `max_speculative_batch` sources, or when the planner (built from the
    machine's costs) prices speculation slower: where verification is compute-bound, as
    on a CPU at large batches, a draft tree costs more target work than the steps it
    saves (as vLLM's `speculative_disable_by_batch_size`). Exact, the output is the same
    either way; relaxed, a plain call's output is beam search's. A call whose caches and logits would exceed the
    machine's memory budget is decoded in chunks of sources, with the same output; if one
    source alone needs more, the draft gets shallower, then narrower.
    """

    def __init__(
        self,
        model: Seq2SeqModel,
        draft_model: Seq2SeqModel | DraftHead | None,
        target_vocab_info: VocabularyInfo,
        algo: BeamSearchAlgorithm | None = None,
        *,
        config: SpeculativeSearchConfig | None = None,
        step_processors: Sequence[StepProcessor] | None = None,
        **settings: Any,
    ) -> None:
        if target_vocab_info.eos_idx is None:
            raise ValueError("`target_vocab_info` must have `eos_idx` set for sequence generation.")
        if algo is not None and not isinstance(algo, StandardBeamSearchAlgorithm):
            raise NotSupportedError(
                "only fairseq2's StandardBeamSearchAlgorithm can be replayed exactly"
            )
        self.config = config = SpeculativeSearchConfig.of(config, **settings)  # checked
        check_pair(model, draft_model)
        s = config.search
        if s.beam_size >= target_vocab_info.size:
            raise ValueError(
                f"beam_size={s.beam_size} is invalid: must be below the vocabulary's "
                f"{target_vocab_info.size} entries"
            )
        model.eval()
        if draft_model is not None:
            draft_model.eval()
        self._model = model
        self._draft_model = draft_model
        self._vocab_info = target_vocab_info
        self._draft_shape = config.draft_shape  # the shape in effect; a budget may shrink it
        self._relaxation = s.relaxation()
        self._capacity_increment = checked_increment(s.decode_capacity_increment)
        self._step_processors = list(step_processors or [])
        self._runtime = Runtime(config.machine.runtime_config())
        self._warned_shrink = False
        self._planner = config.planner() if draft_model is not None else None
        self._gate = config.gate(self._planner)
        self._told_plain = False
        self._plain = (
            None
            if s.plain == "lean"
            else BeamSearchSeq2SeqGenerator(
                model,
                target_vocab_info,
                algo,
                **s.fairseq2_keywords(),
                step_processors=step_processors,
            )
        )

    @property
    @override
    def model(self) -> Seq2SeqModel:
        return self._model

    @property
    def draft_model(self) -> Seq2SeqModel | DraftHead | None:
        return self._draft_model

    @property
    def planner(self) -> Planner | None:
        """What chooses per call between speculation and plain search (with `plan`) and
        prices the per-pass gate (with `gate`); None: always speculate where there is a
        draft."""
        return self._planner

    @property
    def drafts_with_head(self) -> bool:
        return isinstance(self._draft_model, DraftHead)

    @override
    def register_step_hook(self, hook: StepHook) -> RemovableHandle:
        raise NotSupportedError(
            "step hooks observe one step at a time; a speculative pass advances several"
        )

    @torch.inference_mode()
    @override
    @in_own_runtime
    def __call__(
        self,
        source_seqs: Tensor,
        source_seqs_layout: BatchLayout,
        prompt_seqs: Tensor,
        prompt_seqs_layout: BatchLayout,
    ) -> SpeculativeGeneratorOutput:
        check_call(self._model, self._draft_model, source_seqs, prompt_seqs)
        speculate = self._speculates(len(source_seqs))
        plain = self.config.search.plain
        lean = plain == "lean" or (plain == "auto" and (len(source_seqs) == 1 or onednn.active()))
        if not speculate and not lean:
            assert self._plain is not None
            out = self._plain(source_seqs, source_seqs_layout, prompt_seqs, prompt_seqs_layout)
            return SpeculativeGeneratorOutput(
                out.hypotheses, out.counters, SpecStats(plain_sources=len(source_seqs))
            )
        prompt_len, min_seq_len, max_seq_len = length_limits(
            source_seqs_layout, prompt_seqs_layout, self.config.search.gen_len,
            self.config.search.min_gen_len,
            self.config.search.seq_len_limit(self._model.max_target_seq_len),
        )  # fmt: skip
        prompts = prompt_seqs[:, :prompt_len]
        if not speculate:
            op = _Op(
                self, source_seqs, source_seqs_layout, prompts, min_seq_len, max_seq_len, False
            )
            out = op()
            self._time(False, out)
            # The stats describe speculation; this call is counted as plain only.
            stats = SpecStats(plain_sources=len(source_seqs), seconds=out.stats.seconds)
            return SpeculativeGeneratorOutput(out.hypotheses, out.counters, stats)
        if self.config.machine.memory_budget_bytes is None:
            out = _Op(self, source_seqs, source_seqs_layout, prompts, min_seq_len, max_seq_len)()
        else:
            gen, size = self._fit_budget(len(source_seqs), prompt_len, max_seq_len)
            # Every chunk keeps the whole batch's length limits (fairseq2 derives them from
            # the batch's longest source), so chunking changes no output.
            seq_lens = source_seqs_layout.seq_lens
            outputs = [
                _Op(
                    gen,
                    source_seqs[i : i + size],
                    BatchLayout.of(source_seqs[i : i + size], seq_lens[i : i + size]),
                    prompts[i : i + size],
                    min_seq_len,
                    max_seq_len,
                )()
                for i in range(0, len(source_seqs), size)
            ]
            out = outputs[0] if len(outputs) == 1 else _concatenate(outputs)
        if self._planner is not None and out.stats.target_passes:
            shape = PassShape.of(out.stats)
            self._planner.observe(shape, out.stats.target_passes)
            self._time(True, out, shape)
        return out

    def _time(
        self, speculative: bool, out: SpeculativeGeneratorOutput, shape: PassShape | None = None
    ) -> None:
        """Tells the planner how long this call's passes took."""
        if self._planner is not None:
            s = out.stats
            self._planner.timed(
                speculative, out.counters.generation_time, s.target_passes, s.source_passes, shape
            )

    def _speculates(self, num_sources: int) -> bool:
        """Whether this call drafts: a draft, at most `max_speculative_batch` sources, and
        a planner (if any) that expects it to be faster."""
        limit, planner = self.config.search.max_speculative_batch or None, self._planner
        if self._draft_model is None:
            return False
        if limit is not None and num_sources > limit:
            why = f"batches of more than {limit} sentences (decoding.max_speculative_batch)"
        elif planner is not None and self.config.search.plan and not planner.speculate(num_sources):
            size = f"{num_sources} sentence" + ("s" if num_sources != 1 else "")
            why = f"batches the planner prices faster without the draft (the first: {size})"
        else:
            return True
        if not self._told_plain:
            log.info("%s run exact plain beam search, no draft", why)
            self._told_plain = True
        return False

    def _fit_budget(
        self, num_sources: int, prompt_len: int, max_seq_len: int
    ) -> tuple[SpeculativeBeamSearchSeq2SeqGenerator, int]:
        """This generator, or a copy with a smaller draft if one source does not fit the
        memory budget otherwise, and the number of sources per chunk."""
        budget = self.config.machine.memory_budget_bytes
        assert budget is not None
        k, shape = self.config.search.beam_size, self._draft_shape
        linear = shape.strategy == "linear"
        width = k if linear else shape.width
        min_width = width if linear else k if shape.strategy == "beam" else 1
        assert self._draft_model is not None
        target, draft = DecoderSize.of(self._model), DecoderSize.of(self._draft_model)

        def need(depth: int, width: int) -> int:
            return source_bytes(
                target, draft, k=k, prompt_len=prompt_len, max_seq_len=max_seq_len,
                depth=depth, width=width,
            ).total  # fmt: skip

        fit = fit_budget(budget, num_sources, need, shape.max_depth, width, min_width)
        # Chunks of even size: the same number of chunks, a smaller peak.
        size = -(-num_sources // -(-num_sources // fit.sources))
        if (fit.depth, fit.width) == (shape.max_depth, width):
            return self, size
        if not self._warned_shrink:
            log.warning(
                "memory budget of %d bytes: one source needs %d bytes with gamma=%d and "
                "draft_width=%d, so the draft shrinks to gamma=%d, draft_width=%d (same output)",
                budget, need(shape.max_depth, width), shape.max_depth, width, fit.depth,
                fit.width,
            )  # fmt: skip
            self._warned_shrink = True
        gen = copy.copy(self)
        gen._draft_shape = shape.shrunk(fit.depth, shape.width if linear else fit.width)
        return gen, size


def _concatenate(outputs: list[SpeculativeGeneratorOutput]) -> SpeculativeGeneratorOutput:
    """One output from consecutive chunks' outputs. Chunks run one after another, so
    the peak cache bytes are the largest chunk's; counters of work add up."""
    stats, counters = SpecStats(), GenerationCounters()
    hypotheses: list = []
    for out in outputs:
        hypotheses += out.hypotheses
        stats.merge(out.stats)
        stats.passes_per_source += out.stats.passes_per_source
        stats.steps_per_source += out.stats.steps_per_source
        c = out.counters
        counters.prefill_size += c.prefill_size
        counters.num_generated_elements += c.num_generated_elements
        counters.generation_time += c.generation_time
        counters.cache_size = max(counters.cache_size, c.cache_size)
        counters.cache_capacity = max(counters.cache_capacity, c.cache_capacity)
    return SpeculativeGeneratorOutput(hypotheses, counters, stats)


class _Op(SpeculativeLoop[BeamState]):
    """One beam-search call's state, and its steps of the loop."""

    def __init__(
        self,
        gen: SpeculativeBeamSearchSeq2SeqGenerator,
        source_seqs: Tensor,
        source_layout: BatchLayout,
        prompts: Tensor,
        min_seq_len: int,
        max_seq_len: int,
        speculate: bool = True,
    ) -> None:
        """Without `speculate`, no draft runs: every pass verifies the roots alone, so it
        is plain beam search, one step per target call."""
        vocab, s, shape = gen._vocab_info, gen.config.search, gen._draft_shape
        k = s.beam_size
        num_sources, prompt_len = prompts.shape
        width = k if shape.strategy == "linear" else shape.width
        self.rules = ScoringRules.of(
            vocab,
            unk_penalty=s.unk_penalty,
            temperature=s.temperature,
            min_seq_len=min_seq_len,
            max_seq_len=max_seq_len,
            step_processors=gen._step_processors,
        )
        depth = shape.max_depth if speculate else 0
        chain_len = head_chain_len(prompt_len, depth) if gen.drafts_with_head else prompt_len
        capacity = cache_capacity(max_seq_len, chain_len, k, depth, width)
        if speculate:
            assert gen.draft_model is not None
            target, draft = TreeDecoder.pair(
                gen.model, gen.draft_model, source_seqs, source_layout, hyps_per_source=k,
                capacity=capacity, capacity_increment=gen._capacity_increment,
                lean_draft=s.lean_draft, lean_target=s.lean_target,
            )  # fmt: skip
            self.drafter: Drafter | None = Drafter(
                draft, self.rules, prompts[:, None, :], shape, gate=gen._gate
            )
        else:
            target = TreeDecoder(
                gen.model, source_seqs, source_layout, hyps_per_source=k, capacity=capacity,
                capacity_increment=gen._capacity_increment, lean=s.lean_target,
            )  # fmt: skip
            self.drafter = None
        self.verifier = Verifier(target)
        finish = HypothesisFactory(
            int(vocab.eos_idx),
            prompt_len,
            s.echo_prompt,
            s.normalize_scores,
            s.len_penalty,
        )
        self.acceptor = BeamAcceptor(self.rules, k, finish, gen._relaxation)
        self.state = BeamState.start(prompts, k, max_seq_len)
        self.prompts = prompts
        self.output: list[list] = [[] for _ in range(num_sources)]
        self.stats = SpecStats(
            passes_per_source=[0] * num_sources,
            steps_per_source=[0] * num_sources,
        )

    @property
    def hyps_per_row(self) -> int:
        return self.acceptor.k

    def _propose(self, drafter: Drafter) -> DraftTree:
        return drafter.propose(self.state.scores, self.state.n)

    def _score_prompt(self, verification: Verification) -> None:
        self.acceptor.score_prompt(self.state, verification, self.prompts)

    def _accept(self, verification: Verification, tree: DraftTree) -> Acceptance:
        acceptance = self.acceptor.accept(self.state, verification, tree, self.output)
        # A source at the length limit is done, as fairseq2's loop ends there, even with
        # fewer than k hypotheses finished (a step processor that bans EOS).
        ended = self.state.step_nr >= self.rules.max_seq_len
        if ended.any():
            acceptance.done = acceptance.done | ended.to(acceptance.done.device)
        return acceptance

    def _drop(self, done: Tensor) -> Tensor:
        """Acceptance has moved the finished hypotheses to the output: here they are
        ranked, as fairseq2 ranks them."""
        for source in self.state.source_ids[done].tolist():
            self.output[source].sort(key=lambda h: h.score, reverse=True)  # stable, as in fairseq2
        return surviving_rows(done)
