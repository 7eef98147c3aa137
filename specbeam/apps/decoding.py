"""Decoding settings and the generator they build: plain fairseq2 or speculative."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.generation.sampling import SamplingSeq2SeqGenerator, TopKSampler, TopPSampler
from fairseq2.models.seq2seq import Seq2SeqModel
from omegaconf import OmegaConf

from specbeam.apps.paths import REPO_ROOT
from specbeam.search.draft import DraftShape, draft_keywords
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.planner import Planner
from specbeam.search.relax import Relaxation
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator


@dataclass(kw_only=True)
class DecodingConfig:
    name: str = "spec_beam"
    speculative: bool = True
    search: str = "beam"
    """beam: fairseq2's beam search (exact speculation); sample: fairseq2's sampling
    (speculative sampling: the same distribution of outputs)."""
    beam_size: int = 5
    gamma: int = 4
    draft_strategy: str = "beam"
    """beam, linear or topm (see specbeam/search/draft.py)."""
    draft_width: int | None = None
    max_draft_nodes: int | None = None
    draft_branch: int = 2
    draft_branch_depth: int = 1
    draft_branch_below: float = 1.0
    draft_prune_margin: float | None = None
    gamma_bounds: list[int] | None = None
    """[lo, hi]: adapt γ per source within these bounds; null: fixed γ."""
    draft_vocab: int | None = None
    """A draft head drafts from its this many most frequent target-side tokens (FR-Spec);
    null: all the tokens it ranks (a draft without a ranking: the whole vocabulary); 0:
    the whole vocabulary. Verification always covers all of it."""
    relax_top: int = 0
    """> 0: relaxed acceptance (not exact) with the target's top-β = relax_top."""
    relax_gap: float = 2.0
    max_speculative_batch: int = 0
    """> 0: batches of more sentences run plain beam search (exact decoding only; same
    output). On a CPU, verification turns compute-bound as batches grow."""
    plan: bool = True
    """Exact spec_beam: the hardware config's cost model (`hardware.costs`) chooses per
    batch between speculation and plain beam search (same output), so that the default is
    never slower than plain search; false: always speculate (as far as
    max_speculative_batch allows)."""
    plan_tau: float = 1.8
    """The planner's guess of τ before this run has seen a pass (then it goes by the τ it
    sees); hardware configs tune it per decoding."""
    plain: str = "auto"
    """Which plain beam search runs: of a plain decoding (beam, greedy), and of the batches
    spec_beam does not speculate: lean (specbeam's own loop without a draft, on the lean
    decoder; same output), fairseq2 (its BeamSearchSeq2SeqGenerator), or auto (lean where
    the linears run on oneDNN, `hardware.onednn`; without it lean for one sentence, fairseq2
    for more). See `SpeculativeBeamSearchSeq2SeqGenerator`'s docstring for the figures."""
    lean_draft: bool = True
    """Run the draft's decoder as plain tensor ops (specbeam/search/lean_decoder.py), not
    through fairseq2's modules: same numbers, less per-call overhead."""
    lean_target: bool = True
    """The same for the target's decoder (logits within 1e-5 of fairseq2's)."""
    len_penalty: float = 1.0
    min_gen_len: int = 1
    max_gen_len: list[float] = field(default_factory=lambda: [1.5, 10])
    """a, b: at most a × (longest source in the batch) + b tokens."""
    unk_penalty: float = 0.0
    sampler: str = "top_p"
    """sample: top_p or top_k."""
    top_p: float = 0.9
    top_k: int = 50
    seed: int = 0
    """sample: seeds torch's generator, which fairseq2's samplers draw from."""
    temperature: float = 1.0

    def validate(self) -> None:
        def bad(setting: str, value: object, allowed: str) -> ValueError:
            return ValueError(f"decoding.{setting}={value} is invalid: {allowed}")

        if self.search not in ("beam", "sample"):
            raise bad("search", self.search, "allowed: beam, sample")
        if self.plain not in ("lean", "fairseq2", "auto"):
            raise bad("plain", self.plain, "allowed: lean, fairseq2, auto")
        if self.sampler not in ("top_p", "top_k"):
            raise bad("sampler", self.sampler, "allowed: top_p, top_k")
        if self.temperature <= 0:
            raise bad("temperature", self.temperature, "must be > 0")
        if self.beam_size < 1:
            raise bad("beam_size", self.beam_size, "must be ≥ 1")
        if len(self.max_gen_len) != 2:
            raise bad("max_gen_len", self.max_gen_len, "expected [a, b]")
        if self.gamma_bounds is not None and len(self.gamma_bounds) != 2:
            raise bad("gamma_bounds", self.gamma_bounds, "expected [lo, hi] or null")
        if not self.speculative:
            return
        for setting, value, allowed in self.draft_shape().problems():
            raise bad(setting, value, f"must be {allowed}")
        for setting in ("relax_top", "relax_gap", "max_speculative_batch"):
            if getattr(self, setting) < 0:
                raise bad(setting, getattr(self, setting), "must be ≥ 0")
        if self.max_speculative_batch > 0 and (self.search != "beam" or self.relax_top > 0):
            raise bad(
                "max_speculative_batch", self.max_speculative_batch,
                "applies to exact speculative beam search only (set it to 0)",
            )  # fmt: skip

    def draft_shape(self) -> DraftShape:
        return DraftShape.of(beam_size=self.beam_size, **draft_keywords(self))

    @property
    def exact_beam(self) -> bool:
        """Exact speculative beam search: the only decoding whose output does not depend
        on whether a batch speculates, so the only one a planner may switch."""
        return self.speculative and self.search == "beam" and self.relax_top == 0

    def relaxation(self) -> Relaxation | None:
        return Relaxation(self.relax_top, self.relax_gap) if self.relax_top > 0 else None

    def method_settings(self) -> tuple[str, set[str]]:
        """The decoding file `name` is made from, and the settings its method string sets."""
        base, dotlist = parse_method(self.name)
        return base, {item.split("=", 1)[0] for item in dotlist}


def parse_method(method: str) -> tuple[str, list[str]]:
    """`name:key=value;key=value` -> the decoding's name and its settings as a dotlist."""
    name, _, overrides = method.partition(":")
    return name, [item for item in overrides.split(";") if item]


def load_decoding(method: str) -> DecodingConfig:
    """`name` or `name:key=value;key=value`, e.g. `spec_beam:gamma=6;draft_width=8`."""
    name, dotlist = parse_method(method)
    path = REPO_ROOT / "conf" / "decoding" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ValueError(f"methods: unknown decoding '{name}'; allowed: {known}")
    merged = OmegaConf.merge(
        OmegaConf.structured(DecodingConfig),
        OmegaConf.load(path),
        OmegaConf.from_dotlist(dotlist),
        {"name": method},
    )
    return OmegaConf.to_object(merged)


def make_generator(
    cfg: DecodingConfig,
    target: Seq2SeqModel,
    draft: Seq2SeqModel | None,
    vocab_info: VocabularyInfo,
    *,
    memory_budget_bytes: int | None = None,
    planner: Planner | None = None,
) -> Seq2SeqGenerator:
    """`memory_budget_bytes` (hardware.memory_budget_mb) bounds speculative decoding only:
    fairseq2's beam search sizes its own cache. `planner` (`HardwareConfig.planner`)
    chooses per batch whether exact spec_beam speculates."""
    cfg.validate()
    common = dict(
        len_penalty=cfg.len_penalty,
        min_gen_len=cfg.min_gen_len,
        max_gen_len=(float(cfg.max_gen_len[0]), int(cfg.max_gen_len[1])),
        unk_penalty=cfg.unk_penalty,
        temperature=cfg.temperature,
    )
    if cfg.speculative and draft is None:
        raise ValueError(f"decoding={cfg.name} is speculative but the model pair has no draft")
    if cfg.search == "sample":
        torch.manual_seed(cfg.seed)
        sampler = TopPSampler(cfg.top_p) if cfg.sampler == "top_p" else TopKSampler(cfg.top_k)
        if not cfg.speculative:
            return SamplingSeq2SeqGenerator(target, vocab_info, sampler, **common)
        return SpeculativeSamplingSeq2SeqGenerator(
            target,
            draft,
            vocab_info,
            sampler,
            gamma=cfg.gamma,
            lean_draft=cfg.lean_draft,
            lean_target=cfg.lean_target,
            **common,  # type: ignore[arg-type]
        )
    common["beam_size"] = cfg.beam_size
    if not cfg.speculative and cfg.plain == "fairseq2":
        return BeamSearchSeq2SeqGenerator(target, vocab_info, **common)
    if not cfg.speculative:
        return SpeculativeBeamSearchSeq2SeqGenerator(
            target, None, vocab_info, lean_target=cfg.lean_target, plain=cfg.plain, **common
        )
    return SpeculativeBeamSearchSeq2SeqGenerator(
        target, draft, vocab_info, **draft_keywords(cfg), relaxation=cfg.relaxation(),
        memory_budget_bytes=memory_budget_bytes, lean_draft=cfg.lean_draft,
        lean_target=cfg.lean_target, plain=cfg.plain,
        planner=planner,
        max_speculative_sources=cfg.max_speculative_batch or None, **common,
    )  # fmt: skip
