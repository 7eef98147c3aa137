"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) as a fairseq2 generator.

The draft samples a chain of γ tokens from its distribution q; one target pass gives the
target's p at every chain position. Token x is kept with probability min(1, p(x)/q(x));
at the first rejection the next token is drawn from norm(max(p - q, 0)), and after γ
kept tokens from p. Each emitted token is then distributed exactly as p, so the samples
follow fairseq2's `SamplingSeq2SeqGenerator` on the target (same temperature, sampler,
length limits and penalties), with ~τ tokens per target pass. Samples of a source are
independent, so `num_gens` samples are `num_gens` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, final

import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.error import NotSupportedError
from fairseq2.generation import (
    Hypothesis,
    Seq2SeqGenerator,
    StepHook,
)
from fairseq2.generation.sampling import Sampler, TopKSampler, TopPSampler
from fairseq2.generation.step_processor import StepProcessor
from fairseq2.models.seq2seq import Seq2SeqModel
from fairseq2.nn import BatchLayout
from torch import Tensor
from torch.nn.functional import softmax
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from specbeam.kernels.runtime import Runtime, in_own_runtime
from specbeam.search.accept import Acceptance
from specbeam.search.checks import check_call, check_pair
from specbeam.search.config import SpeculativeSearchConfig
from specbeam.search.draft import Drafter, DraftShape
from specbeam.search.head import DraftHead
from specbeam.search.loop import SpeculativeLoop
from specbeam.search.memory import cache_capacity, checked_increment, head_chain_len
from specbeam.search.rules import ScoringRules, length_limits
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput
from specbeam.search.tree import DraftTree
from specbeam.search.tree_attention import TreeDecoder
from specbeam.search.verify import Verification, Verifier

SAMPLING_TEMPERATURE = 0.6
"""fairseq2's `SamplingSeq2SeqGenerator` default (its beam search's is 1)."""

Filter = Callable[[Tensor], Tensor]
"""probs (..., V) -> the distribution a fairseq2 sampler draws from, (..., V)."""


def sampler_filter(sampler: Sampler) -> Filter:
    """The distribution behind fairseq2's `TopPSampler` / `TopKSampler.sample`, as
    probabilities (the samplers only return draws)."""
    if isinstance(sampler, TopPSampler):
        return lambda probs: _top_p(probs, sampler._p)
    if isinstance(sampler, TopKSampler):
        return lambda probs: _top_k(probs, sampler._k)
    raise NotSupportedError(f"speculative sampling supports TopPSampler and TopKSampler, not {type(sampler).__name__}")  # fmt: skip


def _top_p(probs: Tensor, p: float) -> Tensor:
    probs = probs / probs.sum(-1, keepdim=True)
    sorted_probs, order = probs.sort(-1, descending=True)
    sorted_probs[(sorted_probs.cumsum(-1) - sorted_probs) > p] = 0.0
    sorted_probs /= sorted_probs.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def _top_k(probs: Tensor, k: int) -> Tensor:
    k = min(k, probs.size(-1))
    if k == 1:
        return torch.zeros_like(probs).scatter_(-1, probs.argmax(-1, keepdim=True), 1.0)
    top, index = probs.topk(k, dim=-1, sorted=False)
    return torch.zeros_like(probs).scatter_(-1, index, top / top.sum(-1, keepdim=True))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """The distribution after a rejection: norm(max(p - q, 0)); p where q is all 0 (no
    draft token at this position) or equals p."""
    rest = (p - q).clamp(min=0)
    total = rest.sum(-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp(min=1e-30), p)


@dataclass(frozen=True)
class TargetRules:
    """fairseq2 0.8.1 `_SamplingSequenceGeneratorOp._step`, for rows at different steps."""

    vocab: VocabularyInfo
    temperature: float
    unk_penalty: float
    min_seq_len: int
    max_seq_len: int
    filter: Filter

    def __call__(self, logits: Tensor, step_nr: Tensor) -> tuple[Tensor, Tensor]:
        """logits (S, T, V) at sequence indices step_nr (S, T) -> (what fairseq2 records as
        step scores, the distribution it samples from), each (S, T, V)."""
        eos = int(self.vocab.eos_idx)  # type: ignore[arg-type]
        probs = softmax(logits / self.temperature, dim=-1, dtype=torch.float32)
        forced = step_nr >= self.max_seq_len - 1  # the last step is EOS, whatever p says
        scored = probs.clone()
        if self.vocab.unk_idx is not None:
            # fairseq2 subtracts from probabilities; below 0 its sampler would fail.
            scored[..., self.vocab.unk_idx] = (scored[..., self.vocab.unk_idx] - self.unk_penalty).clamp(min=0)  # fmt: skip
        if self.vocab.pad_idx is not None:
            scored[..., self.vocab.pad_idx] = 0.0
        scored[..., eos] = scored[..., eos].masked_fill(step_nr < self.min_seq_len - 1, 0.0)
        dist = self.filter(scored)
        eos_only = torch.zeros_like(dist)
        eos_only[..., eos] = 1.0
        dist = torch.where(forced[..., None], eos_only, dist)
        return torch.where(forced[..., None], probs, scored), dist


@final
class DraftSampler:
    """The draft's choice of children: one draw per row from q = filter(draft probs);
    keeps q for the acceptance test."""

    def __init__(self, filter: Filter, generator: torch.Generator | None) -> None:
        self.filter = filter
        self.generator = generator
        self.q: list[Tensor] = []  # per level, (S, V)

    def __call__(self, cand: Tensor, width: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
        """cand: (S, 1, V) draft log-probs (the row's own score is 0)."""
        if d == 0:
            self.q = []
        q = self.filter(cand[:, 0].exp())
        token = torch.multinomial(q, 1, generator=self.generator)  # (S, 1)
        self.q.append(q)
        score = q.gather(1, token).log()
        return score, torch.zeros_like(token), token


@dataclass
class SampleState:
    seqs: Tensor  # (S, L) tokens, prompt included
    step_scores: Tensor  # (S, L) probabilities, as fairseq2's sampling records them
    step_nr: Tensor  # (S,) index of the next token
    source_ids: Tensor  # (S,) each row's source in the caller's batch

    def select_sources(self, keep: Tensor) -> None:
        self.seqs, self.step_scores = self.seqs[keep], self.step_scores[keep]
        self.step_nr, self.source_ids = self.step_nr[keep], self.source_ids[keep]


@final
class SpeculativeSamplingSeq2SeqGenerator(Seq2SeqGenerator):
    """fairseq2's `SamplingSeq2SeqGenerator` plus a draft model; the same distribution
    of outputs. Draws use torch's global generator unless `generator` is given."""

    def __init__(
        self,
        model: Seq2SeqModel,
        draft_model: Seq2SeqModel | DraftHead,
        target_vocab_info: VocabularyInfo,
        sampler: Sampler,
        *,
        config: SpeculativeSearchConfig | None = None,
        num_gens: int = 1,
        compute_scores: bool = False,
        step_processors: Sequence[StepProcessor] | None = None,
        generator: torch.Generator | None = None,
        **settings: Any,
    ) -> None:
        """`config` and `settings` as in `SpeculativeBeamSearchSeq2SeqGenerator`; of the
        search settings, sampling reads fairseq2's (but `beam_size`), `gamma` and the lean
        decoders'. Without a config, the temperature defaults to fairseq2's sampling
        default, as a drop-in for its `SamplingSeq2SeqGenerator`."""
        if target_vocab_info.eos_idx is None:
            raise ValueError("`target_vocab_info` must have `eos_idx` set for sequence generation.")
        if step_processors:
            raise NotSupportedError("step processors are not supported by speculative sampling yet")
        if num_gens < 1:
            raise ValueError(f"`num_gens` must be ≥ 1, but is {num_gens}.")
        if config is None:
            settings.setdefault("temperature", SAMPLING_TEMPERATURE)
        self.config = config = SpeculativeSearchConfig.of(config, **settings)  # checked
        check_pair(model, draft_model)
        s = config.search
        model.eval()
        draft_model.eval()
        self._model = model
        self._draft_model = draft_model
        self._vocab_info = target_vocab_info
        self._filter = sampler_filter(sampler)
        self._num_gens = num_gens
        self._capacity_increment = checked_increment(s.decode_capacity_increment)
        self._compute_scores = compute_scores
        self._generator = generator
        self._runtime = Runtime(config.machine.runtime_config())
        # One linear path over the whole vocabulary: acceptance compares the draft's q
        # with p token by token.
        self.draft_shape = DraftShape(
            strategy="linear", depth=s.gamma, width=1, beam_size=1, vocab=0
        )

    @property
    @override
    def model(self) -> Seq2SeqModel:
        return self._model

    @property
    def draft_model(self) -> Seq2SeqModel:
        return self._draft_model

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
        prompt_len, min_seq_len, max_seq_len = length_limits(
            source_seqs_layout, prompt_seqs_layout, self.config.search.gen_len,
            self.config.search.min_gen_len,
            self.config.search.seq_len_limit(self._model.max_target_seq_len),
        )  # fmt: skip
        g = self._num_gens
        seq_lens = [n for n in source_seqs_layout.seq_lens for _ in range(g)]
        sources = source_seqs.repeat_interleave(g, dim=0)
        prompts = prompt_seqs[:, :prompt_len].repeat_interleave(g, dim=0)
        return _SampleOp(
            self,
            sources,
            BatchLayout.of(sources, seq_lens),
            prompts,
            min_seq_len,
            max_seq_len,
        )()


class _SampleOp(SpeculativeLoop[SampleState]):
    """One sampling call's state, and its steps of the loop; every row is one sample of
    one source."""

    def __init__(
        self,
        gen: SpeculativeSamplingSeq2SeqGenerator,
        sources: Tensor,
        layout: BatchLayout,
        prompts: Tensor,
        min_seq_len: int,
        max_seq_len: int,
    ) -> None:
        rows, prompt_len = prompts.shape
        self.gen = gen
        s = gen.config.search
        self.rules = TargetRules(
            gen._vocab_info, s.temperature, s.unk_penalty, min_seq_len, max_seq_len, gen._filter
        )  # fmt: skip
        chain_len = prompt_len
        if isinstance(gen._draft_model, DraftHead):
            chain_len = head_chain_len(prompt_len, s.gamma)
        capacity = cache_capacity(max_seq_len, chain_len, 1, s.gamma, 1)
        target, draft = TreeDecoder.pair(
            gen.model, gen._draft_model, sources, layout, hyps_per_source=1, capacity=capacity,
            capacity_increment=gen._capacity_increment, lean_draft=s.lean_draft,
            lean_target=s.lean_target,
        )  # fmt: skip
        self.verifier = Verifier(target)
        self.draw = DraftSampler(gen._filter, gen._generator)
        draft_rules = ScoringRules.of(
            gen._vocab_info,
            unk_penalty=s.unk_penalty,
            temperature=s.temperature,
            min_seq_len=min_seq_len,
            max_seq_len=max_seq_len,
        )
        self.drafter = Drafter(draft, draft_rules, prompts[:, None, :], gen.draft_shape, self.draw)
        # Room for a pass's positions past the end (never kept: the last step is EOS).
        device = prompts.device
        seqs = torch.zeros((rows, max_seq_len + s.gamma + 1), dtype=torch.int64, device=device)
        seqs[:, :prompt_len] = prompts
        self.state = SampleState(
            seqs,
            torch.zeros(seqs.shape, device=device),
            torch.full((rows,), prompt_len, device=device),
            torch.arange(rows, device=device) // gen._num_gens,
        )
        self.prompts = prompts
        num_sources = rows // gen._num_gens
        self.output: list[list[Hypothesis]] = [[] for _ in range(num_sources)]
        self.stats = SpecStats(
            passes_per_source=[0] * num_sources,
            steps_per_source=[0] * num_sources,
        )

    @property
    def hyps_per_row(self) -> int:
        return 1

    def _propose(self, drafter: Drafter) -> DraftTree:
        step_nr = self.state.step_nr
        return drafter.propose(torch.zeros((len(step_nr), 1), device=step_nr.device), 1)

    def _drop(self, done: Tensor) -> Tensor:
        """The finished rows' samples go to the output. The others keep their order: the
        draws of a pass are taken row by row, so moving rows would change the samples a
        seed gives."""
        for row in done.nonzero()[:, 0].tolist():
            self._finish(row)
        return (~done).nonzero().squeeze(1)

    def _score_prompt(self, verification: Verification) -> None:
        """fairseq2's prefill: the prompt tokens' probabilities under temperature only."""
        p = self.prompts.size(1)
        if p < 2:
            return
        logits = verification.logits_at(verification.chain_slots[:, 0, :-1])
        probs = softmax(logits / self.rules.temperature, dim=-1, dtype=torch.float32)
        self.state.step_scores[:, 1:p] = probs.gather(2, self.prompts[:, 1:, None]).squeeze(-1)

    def _accept(self, verification: Verification, tree: DraftTree) -> Acceptance:
        """Writes each row's kept draft tokens and its next token into the state: a
        chain's kept nodes, then the draw from the residual (or from p after them all)."""
        state, depth = self.state, tree.depth
        device = state.step_nr.device
        rows = torch.arange(len(state.step_nr), device=device)
        tokens, valid = tree.tokens[:, :, 0], tree.valid[:, :, 0]  # (S, D)
        slots = torch.cat([verification.root_slots, verification.node_slots[:, :, 0]], 1)
        positions = state.step_nr[:, None] + torch.arange(depth + 1, device=device)  # (S, D + 1)
        scored, p = self.rules(verification.logits_at(slots), positions)
        # (S, D, V); a draft head's first pass drafts nothing (D = 0)
        q = torch.stack(self.draw.q, 1) if depth else p.new_zeros((len(rows), 0, p.size(-1)))
        q = q * valid[..., None]
        px, qx = (
            p[:, :depth].gather(2, tokens[..., None])[..., 0],
            q.gather(2, tokens[..., None])[..., 0],
        )
        u = torch.rand(qx.shape, generator=self.gen._generator, device=device)
        kept = (valid & (u * qx < px)).int().cumprod(1).sum(1)  # (S,) leading accepts
        p_next = p[rows, kept]
        q_next = torch.cat([q, q.new_zeros((len(rows), 1, q.size(-1)))], 1)[rows, kept]
        nxt = torch.multinomial(residual(p_next, q_next), 1, generator=self.gen._generator)[:, 0]
        new = torch.cat([tokens, tokens.new_zeros((len(rows), 1))], 1)
        new[rows, kept] = nxt
        write = torch.arange(depth + 1, device=device) <= kept[:, None]  # (S, D + 1)
        state.seqs.scatter_(1, positions, torch.where(write, new, state.seqs.gather(1, positions)))
        new_scores = scored.gather(2, new[..., None])[..., 0]
        old_scores = state.step_scores.gather(1, positions)
        state.step_scores.scatter_(1, positions, torch.where(write, new_scores, old_scores))
        state.step_nr = state.step_nr + kept + 1
        last = (kept - 1)[:, None]  # the last kept node's id (-1: none)
        return Acceptance(
            origin=torch.zeros_like(last),
            node=last,
            roots=nxt[:, None],
            steps=kept + 1,
            accepted=kept,
            done=nxt == self.rules.vocab.eos_idx,
        )

    def _finish(self, row: int) -> None:
        """fairseq2's `_finish_sequence` of the sampling generator."""
        gen, state = self.gen, self.state
        start = 0 if gen.config.search.echo_prompt else self.prompts.size(1)
        end = int(state.step_nr[row])
        seq = state.seqs[row, start:end].clone()
        score, step_scores = None, None
        if gen._compute_scores:
            all_scores = state.step_scores[row, :end]
            score = all_scores[1:].log().sum()
            if gen.config.search.normalize_scores:
                score /= (end - 1) ** gen.config.search.len_penalty
            step_scores = all_scores[start:].clone()
        self.output[int(state.source_ids[row])].append(Hypothesis(seq, score, step_scores))
