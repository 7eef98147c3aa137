"""Exact speculative beam search as a fairseq2 `Seq2SeqGenerator`.

One loop (DESIGN.md §3): the draft proposes a tree below every live hypothesis, the
target verifies all trees in one call, exact acceptance replays beam search on the
verified log-probs, and both caches keep the accepted paths.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from typing import Literal, final

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

from specbeam.search import onednn
from specbeam.search.accept import Acceptance, BeamAcceptor
from specbeam.search.beam import BeamState, HypothesisFactory
from specbeam.search.cache import surviving_rows
from specbeam.search.draft import Drafter, DraftShape, DraftStrategy
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
from specbeam.search.relax import Relaxation
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
    verification pass computes (`specbeam.search.head`).

    The draft runs a beam search of width `draft_width` (default: `beam_size`) for `gamma`
    steps from the live hypotheses ("beam"), extends each one greedily ("linear"), or
    branches into its `draft_branch` best tokens for `draft_branch_depth` levels where its
    best token's probability is below `draft_branch_below` ("topm", keeping `draft_width`
    nodes per level, default beam_size × draft_branch). `draft_prune_margin` drops nodes
    scoring that far below the level's k-th best; `max_draft_nodes` keeps each source's
    most likely drafted nodes for verification. With `gamma_bounds`, each source's depth
    follows the steps it advances per pass. `draft_vocab` drafts from a draft head's most
    frequent target-side tokens only (FR-Spec; by default all the tokens it ranks, 0:
    the whole vocabulary). None of these changes the output;
    a `relaxation` does (it accepts drafted steps the target ranks slightly lower).
    Nor does `lean_draft`, which runs the draft's decoder as plain tensor ops where its
    layers allow (`specbeam.search.lean_decoder`): fewer milliseconds per draft call.

    `decode_capacity_increment` is the caches' growth step, as in fairseq2 (None:
    allocated for the length limit up front). `prefill_chunk_size` is accepted for
    drop-in compatibility: the prompt is decoded in the first verification pass.

    `memory_budget_bytes` bounds a call's KV caches and logits (`specbeam.search.memory`): a
    batch that needs more is decoded in consecutive chunks of sources, with the same
    output; if one source alone needs more, the draft gets shallower, then narrower.

    Calls with more than `max_speculative_sources` sources, calls the `planner` prices
    as faster without the draft, and every call when `draft_model` is None run plain beam
    search on the target alone (as vLLM's `speculative_disable_by_batch_size`): where
    verification is compute-bound, as on a CPU at large batches, a draft tree costs more
    target work than the steps it saves. Exact decoding only, so the output is the same
    either way. `plain="lean"` runs that search through this generator's own loop with
    no draft (one step per target call, on the lean path); `"fairseq2"` runs fairseq2's
    `BeamSearchSeq2SeqGenerator`; `"auto"` the first where its linears run on oneDNN
    (`specbeam.search.onednn`; measured on a 2-core CPU: 1.82× fairseq2's speed at one
    sentence, 1.51× at 16), else the first for one sentence and the second for more
    (without oneDNN: 1.04× at one sentence, 0.94× at 16, where its per-source attention
    over all k hypotheses' slots costs more).
    `lean_target` runs the target's decoder as plain tensor ops
    (`specbeam.search.lean_decoder`, same numbers within 1e-5) where its layers allow.
    """

    def __init__(
        self,
        model: Seq2SeqModel,
        draft_model: Seq2SeqModel | DraftHead | None,
        target_vocab_info: VocabularyInfo,
        algo: BeamSearchAlgorithm | None = None,
        *,
        beam_size: int = 5,
        min_gen_len: int = 1,
        max_gen_len: tuple[float, int] = (1.0, 128),
        max_seq_len: int | None = None,
        echo_prompt: bool = False,
        normalize_scores: bool = True,
        temperature: float = 1.0,
        unk_penalty: float = 0.0,
        len_penalty: float = 1.0,
        prefill_chunk_size: int | None = 512,
        decode_capacity_increment: int | None = 16,
        memory_budget_bytes: int | None = None,
        step_processors: Sequence[StepProcessor] | None = None,
        gamma: int = 4,
        draft_strategy: DraftStrategy = "beam",
        draft_width: int | None = None,
        max_draft_nodes: int | None = None,
        draft_branch: int = 2,
        draft_branch_depth: int = 1,
        draft_branch_below: float = 1.0,
        draft_prune_margin: float | None = None,
        gamma_bounds: tuple[int, int] | None = None,
        draft_vocab: int | None = None,
        relaxation: Relaxation | None = None,
        max_speculative_sources: int | None = None,
        lean_draft: bool = True,
        lean_target: bool = True,
        plain: Literal["lean", "fairseq2", "auto"] = "auto",
        planner: Planner | None = None,
    ) -> None:
        if target_vocab_info.eos_idx is None:
            raise ValueError("`target_vocab_info` must have `eos_idx` set for sequence generation.")
        if algo is not None and not isinstance(algo, StandardBeamSearchAlgorithm):
            raise NotSupportedError(
                "only fairseq2's StandardBeamSearchAlgorithm can be replayed exactly"
            )
        if beam_size < 1:
            raise ValueError(f"`beam_size` must be ≥ 1, but is {beam_size}.")
        if min_gen_len < 1:
            raise ValueError(f"`min_gen_len` must be ≥ 1, but is {min_gen_len}.")
        self._draft_shape = DraftShape.of(
            beam_size=beam_size,
            gamma=gamma,
            draft_strategy=draft_strategy,
            draft_width=draft_width,
            max_draft_nodes=max_draft_nodes,
            draft_branch=draft_branch,
            draft_branch_depth=draft_branch_depth,
            draft_branch_below=draft_branch_below,
            draft_prune_margin=draft_prune_margin,
            gamma_bounds=gamma_bounds,
            draft_vocab=draft_vocab,
        )
        self._draft_shape.validate()
        if relaxation is not None:
            relaxation.validate()
        self._relaxation = relaxation
        self._lean_draft = lean_draft
        self._lean_target = lean_target
        model.eval()
        if draft_model is not None:
            draft_model.eval()
        self._model = model
        self._draft_model = draft_model
        self._vocab_info = target_vocab_info
        self._beam_size = beam_size
        self._min_gen_len = min_gen_len
        self._max_gen_len = max_gen_len
        limit = model.max_target_seq_len
        self._max_seq_len = limit if max_seq_len is None else min(max_seq_len, limit)
        self._capacity_increment = checked_increment(decode_capacity_increment)
        self._echo_prompt = echo_prompt
        self._normalize_scores = normalize_scores
        self._temperature = temperature
        self._unk_penalty = unk_penalty
        self._len_penalty = len_penalty
        self._step_processors = list(step_processors or [])
        if memory_budget_bytes is not None and memory_budget_bytes < 1:
            raise ValueError(
                f"`memory_budget_bytes` must be ≥ 1 or None, but is {memory_budget_bytes}."
            )
        self._memory_budget = memory_budget_bytes
        self._warned_shrink = False
        if max_speculative_sources is not None and max_speculative_sources < 0:
            raise ValueError(
                f"`max_speculative_sources` must be ≥ 0 or None, but is {max_speculative_sources}."
            )
        plans = max_speculative_sources is not None or planner is not None or draft_model is None
        if plans and relaxation is not None:
            raise ValueError(
                "`max_speculative_sources`, a `planner` or a missing draft needs exact decoding: "
                "with a relaxation, a sentence's output would depend on how it was decoded"
            )
        if plain not in ("lean", "fairseq2", "auto"):
            raise ValueError(f"`plain` must be 'lean', 'fairseq2' or 'auto', but is {plain!r}.")
        self._plain_kind = plain
        self._max_speculative_sources = max_speculative_sources
        self._planner = planner
        self._told_plain = False
        self._plain = None if plain == "lean" else BeamSearchSeq2SeqGenerator(
            model, target_vocab_info, algo, beam_size=beam_size, min_gen_len=min_gen_len,
            max_gen_len=max_gen_len, max_seq_len=max_seq_len, echo_prompt=echo_prompt,
            normalize_scores=normalize_scores, temperature=temperature, unk_penalty=unk_penalty,
            len_penalty=len_penalty, prefill_chunk_size=prefill_chunk_size,
            decode_capacity_increment=decode_capacity_increment, step_processors=step_processors,
        )  # fmt: skip

    @property
    @override
    def model(self) -> Seq2SeqModel:
        return self._model

    @property
    def draft_model(self) -> Seq2SeqModel | DraftHead | None:
        return self._draft_model

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
    def __call__(
        self,
        source_seqs: Tensor,
        source_seqs_layout: BatchLayout,
        prompt_seqs: Tensor,
        prompt_seqs_layout: BatchLayout,
    ) -> SpeculativeGeneratorOutput:
        speculate = self._speculates(len(source_seqs))
        lean = self._plain_kind == "lean" or (
            self._plain_kind == "auto" and (len(source_seqs) == 1 or onednn.active())
        )
        if not speculate and not lean:
            assert self._plain is not None
            out = self._plain(source_seqs, source_seqs_layout, prompt_seqs, prompt_seqs_layout)
            return SpeculativeGeneratorOutput(
                out.hypotheses, out.counters, SpecStats(plain_sources=len(source_seqs))
            )
        prompt_len, min_seq_len, max_seq_len = length_limits(
            source_seqs_layout, prompt_seqs_layout, self._max_gen_len, self._min_gen_len,
            self._max_seq_len,
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
        if self._memory_budget is None:
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
        """Whether this call drafts: a draft, at most `max_speculative_sources` sources, and
        a planner (if any) that expects it to be faster."""
        limit, planner = self._max_speculative_sources, self._planner
        if self._draft_model is None:
            return False
        if limit is not None and num_sources > limit:
            why = f"batches of more than {limit} sentences (decoding.max_speculative_batch)"
        elif planner is not None and not planner.speculate(num_sources):
            size = f"{num_sources} sentence" + ("s" if num_sources != 1 else "")
            why = f"batches the planner prices faster without the draft (the first: {size})"
        else:
            return True
        if not self._told_plain:
            log.info("%s run plain beam search: same output, no draft", why)
            self._told_plain = True
        return False

    def _fit_budget(
        self, num_sources: int, prompt_len: int, max_seq_len: int
    ) -> tuple[SpeculativeBeamSearchSeq2SeqGenerator, int]:
        """This generator, or a copy with a smaller draft if one source does not fit the
        memory budget otherwise, and the number of sources per chunk."""
        assert self._memory_budget is not None
        k, shape = self._beam_size, self._draft_shape
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

        fit = fit_budget(self._memory_budget, num_sources, need, shape.max_depth, width, min_width)
        # Chunks of even size: the same number of chunks, a smaller peak.
        size = -(-num_sources // -(-num_sources // fit.sources))
        if (fit.depth, fit.width) == (shape.max_depth, width):
            return self, size
        if not self._warned_shrink:
            log.warning(
                "memory budget of %d bytes: one source needs %d bytes with gamma=%d and "
                "draft_width=%d, so the draft shrinks to gamma=%d, draft_width=%d (same output)",
                self._memory_budget, need(shape.max_depth, width), shape.max_depth, width, fit.depth,
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
        vocab, k, shape = gen._vocab_info, gen._beam_size, gen._draft_shape
        num_sources, prompt_len = prompts.shape
        width = k if shape.strategy == "linear" else shape.width
        self.rules = ScoringRules.of(
            vocab,
            unk_penalty=gen._unk_penalty,
            temperature=gen._temperature,
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
                lean_draft=gen._lean_draft, lean_target=gen._lean_target,
            )  # fmt: skip
            self.drafter: Drafter | None = Drafter(draft, self.rules, prompts[:, None, :], shape)
        else:
            target = TreeDecoder(
                gen.model, source_seqs, source_layout, hyps_per_source=k, capacity=capacity,
                capacity_increment=gen._capacity_increment, lean=gen._lean_target,
            )  # fmt: skip
            self.drafter = None
        self.verifier = Verifier(target)
        finish = HypothesisFactory(
            int(vocab.eos_idx),
            prompt_len,
            gen._echo_prompt,
            gen._normalize_scores,
            gen._len_penalty,
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
        return self.acceptor.accept(self.state, verification, tree, self.output)

    def _drop(self, done: Tensor) -> Tensor:
        """Acceptance has moved the finished hypotheses to the output: here they are
        ranked, as fairseq2 ranks them."""
        for source in self.state.source_ids[done].tolist():
            self.output[source].sort(key=lambda h: h.score, reverse=True)  # stable, as in fairseq2
        return surviving_rows(done)
