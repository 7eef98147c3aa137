"""Per batch: speculate, or run plain beam search, whichever the cost model says is faster.

On a CPU a verification pass turns compute-bound as batches grow (docs/design.md, "Cost
model and planner"): the draft tree's extra tokens then cost in full, and a pass
advancing τ steps loses to τ plain steps. The planner prices both from a machine's call
costs (fitted here from timed calls and runs by `specbeam.calibrate`, stored per
hardware config) and the τ and tree size this generator has seen so far, each price
scaled by how long that kind of call has actually taken here against its prediction:
costs calibrated on one CPU mislead on another (a draft call's cost relative to a target
call's differs severalfold between an AVX-512 and an AVX2 machine). Exact decoding gives
the same output either way; relaxed decoding plans on its own τ, and runs exact plain beam
search where speculation is priced slower.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, final

import numpy as np
import torch
from torch import Tensor

from specbeam.search.draft import DraftShape
from specbeam.search.stats import SpecStats


@dataclass(frozen=True)
class LinearCost:
    """Milliseconds of one decoder call over `slots` query tokens: a + b · slots."""

    a: float
    b: float

    def ms(self, slots: float) -> float:
        return self.a + self.b * slots

    @classmethod
    def fit(cls, points: Mapping[int, float]) -> LinearCost:
        """The least-squares line through timed calls (query tokens -> ms)."""
        slots = np.asarray(list(points), dtype=float)
        b, a = np.polyfit(slots, np.asarray(list(points.values()), dtype=float), 1)
        return cls(float(a), float(b))


@dataclass(frozen=True)
class PlanCosts:
    """A machine's costs (ms), as `PlanCosts.fit` measures them."""

    target: LinearCost  # one target call over T query tokens of the whole batch
    draft: LinearCost  # one draft call likewise
    accept_ms: float  # a speculative pass's work beside its calls (acceptance, commits, tables), per source
    plain_step_ms: float  # the plain search's own work per step beside its target call

    @classmethod
    def fit(
        cls,
        calls: Mapping[str, Mapping[int, float]],
        beam_size: int,
        plain_seconds: float,
        plain_steps: int,
        speculative: Iterable[tuple[float, SpecStats]],
    ) -> PlanCosts:
        """The costs of timed decoder calls (`calls`: "target" and "draft", query tokens
        -> ms per call) and of runs over the same sentences: the plain search's seconds
        over its steps, and speculative runs' (seconds, stats), whose median work beside
        the calls prices every pass (a run the machine slowed skews it less than a mean)."""
        target, draft = LinearCost.fit(calls["target"]), LinearCost.fit(calls["draft"])
        beside = statistics.median(
            beside_calls_ms(target, draft, seconds, stats) for seconds, stats in speculative
        )
        plain_ms = 1000 * plain_seconds / max(plain_steps, 1)
        return cls(target, draft, beside, plain_ms - target.ms(beam_size))

    @classmethod
    def from_stored(cls, costs: Mapping[str, Any]) -> PlanCosts:
        """The costs as a hardware config stores them (`to_stored`)."""
        try:
            return cls(
                LinearCost(*(float(x) for x in costs["target"])),
                LinearCost(*(float(x) for x in costs["draft"])),
                float(costs["accept_ms"]),
                float(costs["plain_step_ms"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"hardware.costs is incomplete or malformed: {error}") from None

    def to_stored(self) -> dict[str, Any]:
        """The costs as a hardware config stores them: lines as [a, b], rounded finer than
        timings resolve, so that the file stays readable."""
        return {
            "target": [round(self.target.a, 3), round(self.target.b, 4)],
            "draft": [round(self.draft.a, 3), round(self.draft.b, 4)],
            "accept_ms": round(self.accept_ms, 3),
            "plain_step_ms": round(self.plain_step_ms, 3),
        }

    def plain_ms(self, beam_size: int, num_sources: float = 1) -> float:
        """Predicted ms of one plain step over `num_sources` live sources."""
        return self.target.ms(num_sources * beam_size) + self.plain_step_ms

    def pass_ms(
        self, speculative: bool, beam_size: int, num_sources: float, shape: PassShape
    ) -> float:
        """Predicted ms of one pass over `num_sources` live sources: a plain step, or a
        speculative pass of `shape`."""
        s = num_sources
        if not speculative:
            return self.plain_ms(beam_size, s)
        drafting = shape.draft_calls * self.draft.ms(s * shape.draft_slots)
        return self.target.ms(s * shape.slots) + drafting + s * self.accept_ms

    def speedup(self, beam_size: int, shape: PassShape, num_sources: float = 1) -> float:
        """Plain ms per step ÷ speculative ms per step, as calibrated."""
        plain = self.pass_ms(False, beam_size, num_sources, shape)
        return shape.tau * plain / self.pass_ms(True, beam_size, num_sources, shape)


def beside_calls_ms(
    target: LinearCost, draft: LinearCost, seconds: float, stats: SpecStats
) -> float:
    """Ms per source and pass of a speculative run beyond its decoder calls as `target`
    and `draft` price them (acceptance, commits, slot tables, masks, the loop, the
    encoder): the `accept_ms` under which `PlanCosts.pass_ms` prices the run's time."""
    shape = PassShape.of(stats)
    passes = max(stats.target_passes, 1)
    sources = max(stats.source_passes, 1) / passes  # live sources per pass
    pass_ms = 1000 * seconds / passes
    verify = target.ms(sources * shape.slots)
    drafting = shape.draft_calls * draft.ms(sources * shape.draft_slots)
    return (pass_ms - verify - drafting) / sources


@dataclass
class PassShape:
    """What a speculative pass does per live source (the batch's share of its calls);
    a running mean once passes are seen."""

    tau: float = 1.8  # beam-search steps per pass
    slots: float = 24.0  # verified query tokens
    draft_calls: float = 1.9  # per pass: a call drafts for every live source at once
    draft_slots: float = 10.0  # query tokens per draft call

    @classmethod
    def expected(cls, shape: DraftShape, tau: float) -> PassShape:
        """A full tree of `shape` and a guess of τ: the prior before any pass is seen."""
        k = shape.beam_size
        width = k if shape.strategy == "linear" else shape.width
        nodes = shape.depth * width
        if shape.max_nodes is not None:
            nodes = min(nodes, shape.max_nodes)
        return cls(tau=tau, slots=k + nodes, draft_calls=shape.depth, draft_slots=width)

    @classmethod
    def perfect(cls, shape: DraftShape) -> PassShape:
        """A full tree of `shape` from a draft that always holds the target's beam: every
        pass advances depth + 1 steps, the most such trees can (the cost model's ceiling
        for them)."""
        return cls.expected(shape, tau=shape.depth + 1)

    @classmethod
    def of(cls, stats: SpecStats) -> PassShape:
        """The mean pass of a call's stats: tokens per (pass, live source), draft calls
        per pass. At batch 1 a source's pass is the whole pass."""
        per_source = max(stats.source_passes, 1)
        calls = stats.draft_passes / max(stats.target_passes, 1)
        return cls(
            tau=stats.tau,
            slots=stats.verified_slots / per_source,
            draft_calls=calls,
            draft_slots=stats.drafted_tokens / per_source / calls if calls else 0.0,
        )

    def update(self, other: PassShape, weight: float) -> None:
        """Moves each figure `weight` of the way towards `other`'s."""
        for name in ("tau", "slots", "draft_calls", "draft_slots"):
            mine = getattr(self, name)
            setattr(self, name, mine + weight * (getattr(other, name) - mine))


@final
class Planner:
    """Chooses speculation when its predicted speedup over plain search exceeds `margin`.

    τ is only seen while speculating, so a planner that turned plain on a few hard
    sentences would stay plain for good. Where the prediction is close (within
    `explore` of the margin), every `probe_every`-th such call speculates anyway and keeps
    the running τ current.
    """

    def __init__(
        self,
        costs: PlanCosts,
        beam_size: int,
        shape: PassShape | None = None,
        margin: float = 1.0,
        explore: float = 0.15,
        probe_every: int = 8,
    ) -> None:
        self.costs = costs
        self.k = beam_size
        self.shape = shape or PassShape()
        self.margin = margin
        self.explore = explore
        self.probe_every = probe_every
        self._close_calls = 0
        # Measured ÷ predicted ms per pass, plain (False) and speculative (True), and the
        # calls seen of each: the first is left out (it packs weights, warms caches).
        self.factor = {False: 1.0, True: 1.0}
        self._timed_calls = {False: 0, True: 0}
        self._timed_passes = {False: 0, True: 0}  # of the calls counted

    def pass_ms(
        self, speculative: bool, num_sources: float, shape: PassShape | None = None
    ) -> float:
        """Predicted ms of one pass over `num_sources` live sources, as calibrated, of the
        running shape or of `shape`."""
        return self.costs.pass_ms(speculative, self.k, num_sources, shape or self.shape)

    def _factor(self, speculative: bool) -> float:
        """A kind not timed yet is taken to be as far off as the other (a slower machine
        is slower at both)."""
        seen = self._timed_calls[speculative] > 1
        return self.factor[speculative if seen else not speculative]

    def speedup(self, num_sources: int) -> float:
        """Predicted plain ms per step ÷ speculative ms per step, for this batch size."""
        plain = self.pass_ms(False, num_sources) * self._factor(False)
        return self.shape.tau * plain / (self.pass_ms(True, num_sources) * self._factor(True))

    def speculate(self, num_sources: int) -> bool:
        predicted = self.speedup(num_sources)
        if predicted > self.margin:
            return True
        if predicted < self.margin * (1 - self.explore):
            return False
        self._close_calls += 1
        return self._close_calls % self.probe_every == 0

    def observe(self, seen: PassShape, passes: int) -> None:
        """A speculative call's mean pass shape over `passes` passes updates the running one
        (each pass weighs 1/50: a few sentences move it, one odd sentence does not)."""
        self.shape.update(seen, min(1.0, passes / 50))

    def timed(
        self,
        speculative: bool,
        seconds: float,
        passes: int,
        source_passes: int,
        shape: PassShape | None = None,
    ) -> None:
        """A call's measured time over its `passes` passes (`source_passes` live sources
        summed over them, of the call's own `shape` if speculative: its trees were not the
        running mean's) moves that kind's measured ÷ predicted factor: a mean over the
        passes timed so far, then each pass weighs 1/200 (timings are noisier than τ). A
        slowly moving factor from the start would mislead: one kind's factor still near 1
        while the other's stood far off would misprice their ratio by the difference."""
        self._timed_calls[speculative] += 1
        if self._timed_calls[speculative] == 1 or passes == 0:
            return
        predicted = self.pass_ms(speculative, source_passes / passes, shape)
        ratio = 1000 * seconds / passes / predicted
        self._timed_passes[speculative] += passes
        weight = min(1.0, passes / min(self._timed_passes[speculative], 200))
        self.factor[speculative] += weight * (ratio - self.factor[speculative])


@final
class Gate:
    """Per pass and source: verify the draft tree only where it is predicted to pay, else
    take a plain step (exact search: either gives beam search's output).

    The signal is the draft's confidence at the tree's first level (`draft.first_level_mass`),
    which the drafter computes before any deeper draft call or the target call. A pass of
    depth d is predicted to advance τ(d) = 1 + Σ_{j≤d} Π_{i≤j} c_i steps, where c_i is the
    share of passes in the signal's bin that, having covered level i − 1, covered level i:
    learned from the passes that speculated, from a geometric prior that gives the
    planner's τ. Both choices are priced by the planner's cost model: a plain step here
    also pays the draft's first-level call, already made; the gate picks the depth (up to
    the source's own) of the best predicted speedup, and a plain step where none exceeds
    1. Where the best is within `explore` below 1, every `probe_every`-th such pass
    speculates anyway (both the planner's settings), so that bins turned off stay measured.
    """

    def __init__(
        self,
        planner: Planner,
        shape: DraftShape,
        bins: int = 10,
        prior_weight: float = 2.0,
    ) -> None:
        self.planner = planner
        self.shape = shape
        self.bins = bins
        self.explore = planner.explore  # close calls are the planner's, probed as often
        self.probe_every = planner.probe_every
        self._close = 0
        levels = shape.max_depth
        q = _geometric_ratio(planner.shape.tau, shape.depth)
        self.reached = torch.full((bins, levels), prior_weight, dtype=torch.float64)
        self.covered = self.reached * q
        self._shapes = [PassShape.expected(shape.at_depth(d), 1.0) for d in range(1, levels + 1)]
        self._priced: tuple[int, float, float] | None = None
        self._ms = torch.zeros(levels + 1, dtype=torch.float64)

    def _bin(self, confidence: Tensor) -> Tensor:
        return (confidence.double() * self.bins).long().clamp(0, self.bins - 1).cpu()

    def tau(self, confidence: Tensor) -> Tensor:
        """(S, D + 1): the predicted steps of a pass of each depth 0…D."""
        reach = (self.covered / self.reached)[self._bin(confidence)].cumprod(1)
        return torch.nn.functional.pad(reach.cumsum(1), (1, 0)) + 1

    def pass_ms(self, num_sources: int) -> Tensor:
        """(D + 1,): predicted ms per source of a pass of each depth 0…D (depth 0: a plain
        step and the first-level draft call), as the planner prices them now."""
        p = self.planner
        key = (num_sources, p._factor(False), p._factor(True))
        if key != self._priced:
            # The draft call is a speculative pass's part: its measured ÷ predicted factor.
            off = (
                p.pass_ms(False, num_sources) * key[1]
                + p.costs.draft.ms(num_sources * p.k) * key[2]
            )
            spec = [p.pass_ms(True, num_sources, shape) * key[2] for shape in self._shapes]
            self._ms = torch.tensor([off, *spec], dtype=torch.float64) / num_sources
            self._priced = key
        return self._ms

    def depths(self, confidence: Tensor, depths: Tensor) -> Tensor:
        ms = self.pass_ms(len(depths))
        speed = self.tau(confidence) * ms[0] / ms  # (S, D + 1) over plain steps with the call
        d = torch.arange(len(ms))
        allowed = (d >= 1) & (d <= depths.cpu()[:, None])
        best, depth = speed.masked_fill(~allowed, 0.0).max(1)
        close = (best <= 1.0) & (best > 1.0 - self.explore)
        if close.any():
            probes = self._close + close.long().cumsum(0)
            self._close += int(close.sum())
            close &= probes % self.probe_every == 0
        return torch.where((best > 1.0) | close, depth, 0).to(depths.device)

    def observe(self, confidence: Tensor, depths: Tensor, steps: Tensor) -> None:
        level = torch.arange(1, self.shape.max_depth + 1)
        d, s = depths.cpu()[:, None], steps.cpu()[:, None]
        reached = (level <= s) & (level <= d)
        covered = (level < s) & (level <= d)
        b = self._bin(confidence)
        self.reached.index_add_(0, b, reached.double())
        self.covered.index_add_(0, b, covered.double())


def _geometric_ratio(tau: float, depth: int) -> float:
    """q with 1 + q + … + q^depth = τ (τ within [1, depth + 1])."""
    tau = min(max(tau, 1.0), depth + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(40):
        q = (lo + hi) / 2
        lo, hi = (q, hi) if sum(q**j for j in range(depth + 1)) < tau else (lo, q)
    return (lo + hi) / 2
