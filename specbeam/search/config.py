"""The one configuration of a speculative search: every setting, its one default.

`SpeculativeSearchConfig` is what the generators take. It has two parts:
- `SearchSettings`: what the search does. fairseq2's beam search settings under
  fairseq2's names and defaults (`BeamSettings`), and the speculation's own
  (`SpeculationSettings`). The apps' decoding files set these (`decoding.gamma=…`), the
  fairseq2 extension's generator config carries the same fields.
- `MachineSettings`: how this machine runs it: kernels, memory, the planner's costs. The
  apps' hardware files set these (`hardware.onednn=…`).
The generators' fairseq2-style keyword arguments (`beam_size=5, gamma=4`) are search
settings by the same names (`SpeculativeSearchConfig.of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbeam.kernels.runtime import RuntimeConfig
from specbeam.search.draft import DraftShape
from specbeam.search.memory import MB
from specbeam.search.planner import Gate, PassShape, PlanCosts, Planner
from specbeam.search.relax import Relaxation

PLAIN_KINDS: tuple[str, ...] = ("lean", "fairseq2", "auto")


@dataclass(kw_only=True)
class BeamSettings:
    """fairseq2's `BeamSearchConfig` (without `algo`): same names, same defaults."""

    beam_size: int = 5
    """Hypotheses kept per step (fairseq2's beam_size); 1: greedy search."""
    min_gen_len: int = 1
    """Fewest tokens generated (≥ 1), the final EOS included: fairseq2 masks EOS until then."""
    max_gen_len: tuple[float, int] = (1.0, 128)
    """a, b: at most a × (longest source in the batch) + b tokens."""
    max_seq_len: int | None = None
    """Longest output, the target prompt included, at which fairseq2 forces EOS; None: the
    model's own limit (a value above it is capped to it)."""
    echo_prompt: bool = False
    """true: fairseq2 returns each output with its target prompt (e.g. the language token)
    before the generated tokens; false: the generated tokens only."""
    normalize_scores: bool = True
    """true: fairseq2 divides a finished hypothesis' log-probability by its length to the
    power `len_penalty`, and ranks by that; false: by the sum itself."""
    temperature: float = 1.0
    """fairseq2 divides the logits by this before the softmax: > 1 flattens the
    distribution, < 1 sharpens it; > 0."""
    unk_penalty: float = 0.0
    """fairseq2 subtracts this from the UNK token's log-probability at every step: > 0
    gives fewer UNKs, < 0 more."""
    len_penalty: float = 1.0
    """The power of the length a normalized score is divided by (`normalize_scores`):
    < 1 favours shorter outputs, > 1 longer ones."""
    prefill_chunk_size: int | None = 512
    """Accepted for drop-in compatibility: the prompt is decoded in the first pass."""
    decode_capacity_increment: int | None = 16
    """The caches' growth step, as in fairseq2; None: allocated for the length limit."""

    @property
    def gen_len(self) -> tuple[float, int]:
        """`max_gen_len` as fairseq2's generators take it (a config file gives a list)."""
        return float(self.max_gen_len[0]), int(self.max_gen_len[1])

    def seq_len_limit(self, model_limit: int) -> int:
        """`max_seq_len` within what the model holds (its own limit where unset)."""
        return model_limit if self.max_seq_len is None else min(self.max_seq_len, model_limit)

    def fairseq2_keywords(self) -> dict[str, Any]:
        """These settings as keyword arguments of fairseq2's `BeamSearchSeq2SeqGenerator`."""
        names = (f.name for f in dataclasses.fields(BeamSettings))
        return {**{name: getattr(self, name) for name in names}, "max_gen_len": self.gen_len}


@dataclass(kw_only=True)
class SpeculationSettings:
    """The draft tree, the acceptance rule, and when to speculate. Only a relaxation
    (`relax_top`) changes the output; the rest changes speed."""

    gamma: int = 4
    """Draft depth: beam-search steps proposed per target pass."""
    draft_strategy: str = "beam"
    """beam: the draft's own beam search of `draft_width` from the live hypotheses;
    linear: one greedy path per hypothesis; topm: the draft's `draft_branch` best tokens
    for `draft_branch_depth` levels where its best token's probability is below
    `draft_branch_below` (`specbeam.search.draft`)."""
    draft_width: int | None = None
    """Nodes kept per tree level; None: beam_size (topm: times draft_branch)."""
    max_draft_nodes: int | None = None
    """Verify only each source's this many most likely drafted nodes; None: all."""
    draft_branch: int = 2
    """topm: children per branching node, the draft's best tokens there; ≥ 1."""
    draft_branch_depth: int = 1
    """topm: tree levels that may branch, from the first; deeper levels continue greedily."""
    draft_branch_below: float = 1.0
    """topm: a node branches only where the draft's best token has probability below this,
    in (0, 1]; 1.0: every node branches."""
    draft_prune_margin: float | None = None
    """Drop nodes scoring more than this below their level's k-th best; None: keep."""
    gamma_bounds: tuple[int, int] | None = None
    """lo, hi: adapt γ per source within these bounds; None: fixed γ."""
    draft_vocab: int | None = None
    """A draft head drafts from its this many most frequent target-side tokens (FR-Spec);
    None: all the tokens it ranks (a draft without a ranking: the whole vocabulary); 0:
    the whole vocabulary. Verification always covers all of it."""
    relax_top: int = 0
    """> 0: relaxed acceptance (not exact) within the target's top `relax_top`."""
    relax_gap: float = 2.0
    """Relaxed acceptance: and within this log-probability of the target's best."""
    max_speculative_batch: int = 0
    """> 0: calls with more sources run plain beam search (exact decoding only)."""
    plan: bool = True
    """The machine's cost model chooses per call between speculation and plain search
    (`specbeam.search.planner`), so that speculation never runs where it is priced slower;
    false: always speculate. Relaxed, a plain call decodes exact beam search."""
    plan_tau: float = 1.8
    """The planner's guess of τ before it has seen a pass."""
    gate: bool = False
    """Exact beam search with the machine's cost model: choose per pass and source
    between the draft tree and a plain step, from the draft's confidence at the tree's
    first level (`planner.Gate`); false: every pass of a speculating call drafts. Off by
    default as `scripts/bench.py` measured it (docs/bench.md): a gated-off pass still pays
    the draft's first call, so gated speculation lost to lean plain search at beam 5."""
    plain: str = "auto"
    """The plain beam search of calls that do not speculate: lean (this generator's own
    loop without a draft, on the lean decoder), fairseq2 (its
    `BeamSearchSeq2SeqGenerator`), or auto (lean where the linears run on oneDNN or for
    one source, else fairseq2's)."""
    lean_draft: bool = True
    """Run the draft's decoder as plain tensor ops (`specbeam.kernels.lean_decoder`)."""
    lean_target: bool = True
    """The same for the target's decoder (logits within 1e-5 of fairseq2's)."""


@dataclass(kw_only=True)
class SearchSettings(BeamSettings, SpeculationSettings):
    """What the search does."""

    def draft_shape(self) -> DraftShape:
        width = self.draft_width
        if width is None:
            width = self.beam_size * (self.draft_branch if self.draft_strategy == "topm" else 1)
        bounds = self.gamma_bounds
        return DraftShape(
            strategy=self.draft_strategy,  # type: ignore[arg-type]  # checked by problems()
            depth=self.gamma,
            width=width,
            branch=self.draft_branch,
            branch_depth=self.draft_branch_depth,
            branch_below=self.draft_branch_below,
            prune_margin=self.draft_prune_margin,
            max_nodes=self.max_draft_nodes,
            beam_size=self.beam_size,
            depth_bounds=None if bounds is None or len(bounds) != 2 else (bounds[0], bounds[1]),
            vocab=self.draft_vocab,
        )

    @property
    def drafts(self) -> bool:
        """Whether a search on these settings may draft (the apps' plain decodings do not):
        the draft tree's settings are checked only then."""
        return True

    def relaxation(self) -> Relaxation | None:
        return Relaxation(self.relax_top, self.relax_gap) if self.relax_top > 0 else None

    def problems(
        self, draft: bool = True, shape: DraftShape | None = None
    ) -> list[tuple[str, object, str]]:
        """(setting, value, what is allowed) of every setting out of range; the draft
        tree's only with `draft`, on `shape` (default: `draft_shape()`)."""
        checks = [
            ("beam_size", self.beam_size, self.beam_size >= 1, "≥ 1"),
            ("min_gen_len", self.min_gen_len, self.min_gen_len >= 1, "≥ 1"),
            ("max_gen_len", self.max_gen_len, _gen_len_ok(self.max_gen_len), "[a, b] with a, b ≥ 0 and a ≥ 1 or b ≥ 1 (a × source length + b tokens: at least one)"),
            ("temperature", self.temperature, self.temperature > 0, "> 0"),
            ("gamma_bounds", self.gamma_bounds, self.gamma_bounds is None or len(self.gamma_bounds) == 2, "[lo, hi] or None"),
            ("relax_top", self.relax_top, self.relax_top >= 0, "≥ 0"),
            ("relax_gap", self.relax_gap, self.relax_gap >= 0, "≥ 0"),
            ("max_speculative_batch", self.max_speculative_batch, self.max_speculative_batch >= 0, "≥ 0"),
            ("plain", self.plain, self.plain in PLAIN_KINDS, f"one of {PLAIN_KINDS}"),
            ("max_speculative_batch", self.max_speculative_batch, not (self.max_speculative_batch and self.relax_top), "0 with relaxed acceptance (it applies to exact search only)"),
        ]  # fmt: skip
        found = [(name, value, allowed) for name, value, ok, allowed in checks if not ok]
        if not draft or any(name == "gamma_bounds" for name, _, _ in found):
            return found
        return found + (shape or self.draft_shape()).problems()


def _gen_len_ok(limit: Sequence[float]) -> bool:
    """fairseq2 allows a × (longest source) + b tokens, which must be ≥ 1 for any source."""
    return len(limit) == 2 and min(limit) >= 0 and max(limit) >= 1


class SettingError(ValueError):
    """A setting out of range: which, its value and what is allowed, so that an app can
    name it as its files do (`decoding.gamma=0 is invalid: must be ≥ 1`)."""

    def __init__(self, setting: str, value: object, allowed: str) -> None:
        super().__init__(f"`{setting}` must be {allowed}, but is {value!r}.")
        self.setting, self.value, self.allowed = setting, value, allowed


@dataclass(kw_only=True)
class MachineSettings(RuntimeConfig):
    """How this machine runs a search: its kernels (`RuntimeConfig`), memory, costs.
    Checked when made (`validate`): a config file's settings are checked as it is read."""

    memory_budget_mb: float = 0
    """Speculative decoding keeps its KV caches and logits within this many MiB by
    decoding a call in chunks (same output), or a smaller draft; 0: unlimited."""
    costs: dict[str, Any] = field(default_factory=dict)
    """The planner's cost model (`PlanCosts.from_stored`), written by
    `python -m specbeam.calibrate`; empty: no planner, exact search always speculates."""

    @property
    def memory_budget_bytes(self) -> int | None:
        return int(self.memory_budget_mb * MB) or None

    def runtime_config(self) -> RuntimeConfig:
        return settings_of(RuntimeConfig, self)

    def __post_init__(self) -> None:
        self.validate()

    def problems(self) -> list[tuple[str, object, str]]:
        found = super().problems()
        if self.memory_budget_mb < 0:
            found.append(("memory_budget_mb", self.memory_budget_mb, "≥ 0 (0 = unlimited)"))
        return found

    def validate(self) -> None:
        """Raises a SettingError naming the first setting out of range."""
        for name, value, allowed in self.problems():
            raise SettingError(name, value, allowed)


@dataclass(frozen=True)
class SpeculativeSearchConfig:
    """Checked when made: the search settings here (`validate`), the machine's when they
    were made (`MachineSettings`); a generator takes it as it is."""

    search: SearchSettings = field(default_factory=SearchSettings)
    machine: MachineSettings = field(default_factory=MachineSettings)
    draft_shape: DraftShape = field(init=False, repr=False, compare=False)
    """The draft tree of `search`, made once (the generator's, the planner's, the gate's)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "draft_shape", self.search.draft_shape())
        self.validate()

    @classmethod
    def of(
        cls, config: SpeculativeSearchConfig | None = None, **settings: Any
    ) -> SpeculativeSearchConfig:
        """`config` (default: every default) with search settings replaced by keyword:
        the generators' fairseq2-style keyword arguments."""
        config = config or cls()
        if not settings:
            return config
        known = {f.name for f in dataclasses.fields(SearchSettings)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise TypeError(f"unknown search settings: {', '.join(unknown)}")
        return cls(dataclasses.replace(config.search, **settings), config.machine)

    def validate(self) -> None:
        """Raises a SettingError naming the first search setting out of range."""
        s = self.search
        for name, value, allowed in s.problems(draft=s.drafts, shape=self.draft_shape):
            raise SettingError(name, value, allowed)

    def planner(self) -> Planner | None:
        """A fresh planner on the machine's cost model; None without costs or without
        planning or gating. Exact or relaxed alike: a relaxed search plans on its own τ."""
        s = self.search
        if not (self.machine.costs and (s.plan or s.gate)):
            return None
        shape = PassShape.expected(self.draft_shape, s.plan_tau)
        return Planner(PlanCosts.from_stored(self.machine.costs), s.beam_size, shape)

    def gate(self, planner: Planner | None) -> Gate | None:
        """The per-pass gate on `planner`'s costs, if gating."""
        if planner is None or not self.search.gate:
            return None
        return Gate(planner, self.draft_shape)


def settings_of(kind: type, source: object, **changes: Any) -> Any:
    """A `kind` dataclass from the same-named fields of `source` (a config that carries
    them, such as fairseq2's `BeamSearchConfig` subclass of the extension), with `changes`."""
    names = {f.name for f in dataclasses.fields(kind)}
    values: Mapping[str, Any] = {n: getattr(source, n) for n in names if hasattr(source, n)}
    return kind(**{**values, **changes})
