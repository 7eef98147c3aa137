"""The cost model, fitted from timed calls and runs, and the planner that prices a
speculative pass against plain steps with it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator

from specbeam.data.batches import pad
from specbeam.search.config import MachineSettings, SpeculativeSearchConfig
from specbeam.search.draft import DraftShape
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.planner import Gate, LinearCost, PassShape, PlanCosts, Planner
from specbeam.search.stats import SpecStats
from tests.conftest import NLLB_PROMPT, sources
from tests.search.test_generator import assert_plain_iff_not, assert_same

# A machine of this shape: a call costs 10.3 ms + 0.3 ms per query token.
CPU = PlanCosts(LinearCost(10.3, 0.3), LinearCost(1.9, 0.03), accept_ms=1.0, plain_step_ms=1.5)
STORED = {"target": [10.3, 0.3], "draft": [1.9, 0.03], "accept_ms": 1.0, "plain_step_ms": 1.5}
ON_CPU = SpeculativeSearchConfig(machine=MachineSettings(costs=STORED))
"""A search whose machine stores CPU's costs, so that its generators plan."""


def test_speedup_is_steps_per_pass_times_plain_step_over_pass() -> None:
    shape = PassShape(tau=2.0, slots=20.0, draft_calls=2.0, draft_slots=10.0)
    planner = Planner(CPU, beam_size=5, shape=shape)
    plain = 10.3 + 0.3 * 5 + 1.5
    spec = 10.3 + 0.3 * 20 + 2 * (1.9 + 0.03 * 10) + 1.0
    assert planner.speedup(1) == pytest.approx(2.0 * plain / spec)


def test_compute_bound_batches_run_plain() -> None:
    """Past the ridge point every verified token costs in full: a tree of 24 tokens per
    source for 1.8 steps loses to plain steps of 5 tokens, however good the draft."""
    planner = Planner(CPU, beam_size=5, shape=PassShape(tau=2.5))
    assert planner.speculate(1)
    assert not planner.speculate(16)
    speedups = [planner.speedup(n) for n in range(1, 17)]
    assert speedups == sorted(speedups, reverse=True)  # once plain wins, at every larger batch


def test_close_calls_probe_speculation_to_keep_tau_current() -> None:
    """A prediction just below the margin speculates on every 8th call (τ is only seen
    while speculating); a clear loss never does."""
    planner = Planner(CPU, beam_size=5, shape=PassShape(tau=1.0))
    planner.shape.tau = 0.95 / planner.speedup(1)  # the speedup is proportional to τ
    assert planner.speedup(1) == pytest.approx(0.95)
    assert [planner.speculate(1) for _ in range(16)].count(True) == 2
    assert planner.speedup(16) < 0.85
    assert not any(planner.speculate(16) for _ in range(16))


def test_observed_passes_move_the_running_shape() -> None:
    planner = Planner(CPU, beam_size=5, shape=PassShape(tau=3.0))
    before = planner.speedup(1)
    planner.observe(PassShape(tau=1.0, slots=24.0, draft_calls=1.9, draft_slots=10.0), passes=25)
    assert planner.shape.tau == pytest.approx(2.0)  # 25 passes weigh half
    assert planner.speedup(1) < before
    planner.observe(PassShape(tau=1.0), passes=500)
    assert planner.shape.tau == pytest.approx(1.0)


def test_pass_shape_of_stats_is_per_source() -> None:
    stats = SpecStats(target_passes=10, draft_passes=20, source_passes=20, steps=36,
                      drafted_tokens=400, verified_slots=480)  # fmt: skip
    shape = PassShape.of(stats)
    assert (shape.tau, shape.slots, shape.draft_calls, shape.draft_slots) == (1.8, 24.0, 2.0, 10.0)


def test_line_fit_recovers_line_from_noisy_timings() -> None:
    slots = [1, 5, 10, 25, 50, 100]
    noise = np.random.default_rng(0).normal(0, 0.05, len(slots))
    fit = LinearCost.fit({t: 3.0 + 0.2 * t + e for t, e in zip(slots, noise, strict=True)})
    assert fit.a == pytest.approx(3.0, abs=0.1) and fit.b == pytest.approx(0.2, abs=0.005)


def test_costs_fitted_from_runs_price_them_per_source() -> None:
    """Target 5 + 0.1·T ms, draft 1 + 0.1·T ms, a plain step 10 ms, 2 ms per source and
    pass beside the calls: a batch-1 pass (20 slots, 4 draft calls of 5) takes 15 ms, a
    batch-2 one 9 + 4 × 2 + 2 × 2 = 21 ms; both fit the same work per source."""
    calls = {"target": {1: 5.1, 10: 6.0, 50: 10.0}, "draft": {1: 1.1, 5: 1.5, 20: 3.0}}
    one = SpecStats(target_passes=10, source_passes=10, draft_passes=40, steps=40,
                    drafted_tokens=200, verified_slots=200)  # fmt: skip
    two = SpecStats(target_passes=10, source_passes=20, draft_passes=40, steps=80,
                    drafted_tokens=400, verified_slots=400)  # fmt: skip
    costs = PlanCosts.fit(calls, 5, plain_seconds=1.0, plain_steps=100,
                          speculative=[(0.15, one), (0.21, two)])  # fmt: skip
    assert costs.target.a == pytest.approx(5.0) and costs.target.b == pytest.approx(0.1)
    assert costs.accept_ms == pytest.approx(2.0)
    assert costs.plain_step_ms == pytest.approx(10.0 - 5.5)
    assert costs.pass_ms(True, 5, 2, PassShape.of(two)) == pytest.approx(21.0)
    # Against specbeam's plain search: 4 steps × 10 ms over 15 ms.
    assert costs.speedup(5, PassShape.of(one)) == pytest.approx(40 / 15)


def test_costs_are_stored_as_the_hardware_config_writes_them() -> None:
    stored = {"target": [3.99, 0.156], "draft": [0.93, 0.03], "accept_ms": 3.57,
              "plain_step_ms": 1.38}  # fmt: skip
    costs = PlanCosts.from_stored(stored)
    assert costs == PlanCosts(LinearCost(3.99, 0.156), LinearCost(0.93, 0.03), 3.57, 1.38)
    assert costs.to_stored() == stored
    thirds = PlanCosts(LinearCost(1 / 3, 1 / 3), LinearCost(1 / 3, 1 / 3), 1 / 3, 1 / 3)
    assert thirds.to_stored() == {"target": [0.333, 0.3333], "draft": [0.333, 0.3333],
                                  "accept_ms": 0.333, "plain_step_ms": 0.333}  # fmt: skip
    for broken in (
        {**stored, "draft": [1.0]},
        {"target": [1.0, 0.1]},
        {**stored, "accept_ms": "x"},
    ):
        with pytest.raises(ValueError, match="hardware.costs is incomplete or malformed: "):
            PlanCosts.from_stored(broken)


def test_a_perfect_draft_advances_depth_plus_one_steps_per_pass() -> None:
    """The ceiling of a γ 2, width 10 tree at beam 5: 25 verified tokens and 2 draft calls
    per pass for τ 3; with target 10 + 0.2·T ms, draft calls 2 ms, 4 ms beside and a plain
    step of 12 ms, 23 ms per pass, 3 × 12 / 23 times plain search."""
    shape = PassShape.perfect(DraftShape(beam_size=5, depth=2, width=10))
    assert shape == PassShape(tau=3, slots=25, draft_calls=2, draft_slots=10)
    costs = PlanCosts(LinearCost(10.0, 0.2), LinearCost(2.0, 0.0), 4.0, plain_step_ms=1.0)
    assert costs.pass_ms(True, 5, 1, shape) == pytest.approx(23.0)
    assert costs.plain_ms(5) == pytest.approx(12.0)
    assert costs.speedup(5, shape) == pytest.approx(36 / 23)


def test_generator_follows_the_planner(tiny_target, tiny_draft, vocab_info, caplog) -> None:
    """Batches the planner prices as slower with the draft run plain, with the same output;
    speculative calls feed it their τ."""
    caplog.set_level(logging.INFO, logger="specbeam.search.generator")
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, config=ON_CPU, beam_size=4, gamma=3, plan_tau=2.5
    )
    planner = generator.planner
    assert planner is not None and planner.costs == CPU
    beam = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=4)
    for n, speculative in ((1, True), (16, False)):
        assert_plain_iff_not(speculative, generator, beam, batch=n, seed=41)
        if speculative:
            assert planner.shape.tau != 2.5
    assert "the planner prices faster without the draft (the first: 16 sentences)" in caplog.text


def test_relaxed_search_follows_the_planner_on_its_own_tau(tiny_target, tiny_draft, vocab_info):
    """Relaxed acceptance plans too: a batch priced slower with the draft runs exact plain
    beam search (beam search's output), a speculative call feeds the planner its τ."""
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, config=ON_CPU, beam_size=4, gamma=3, plan_tau=2.5,
        relax_top=3, relax_gap=2.0,
    )  # fmt: skip
    planner = generator.planner
    assert planner is not None
    beam = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=4)
    assert_plain_iff_not(False, generator, beam, batch=16, seed=41)
    src, src_layout = pad(sources(seed=41, batch=1), 0)
    prompts, prompt_layout = pad([NLLB_PROMPT], 0)
    out = generator(src, src_layout, prompts, prompt_layout)
    assert out.stats.target_passes > 0 and out.stats.plain_sources == 0
    assert planner.shape.tau != 2.5


def test_measured_times_scale_the_calibrated_prices() -> None:
    """A machine where plain steps take twice the calibrated time, and speculative passes
    the calibrated time, favours speculation twice as much; each kind's first call (packing
    weights, warming caches) is not counted, and a kind not timed yet is taken to be as
    far off as the other."""
    planner = Planner(CPU, beam_size=5, shape=PassShape(tau=2.0))
    before = planner.speedup(1)
    predicted = planner.pass_ms(False, 1)
    planner.timed(False, seconds=10.0, passes=1, source_passes=1)  # the first: ignored
    assert planner.factor[False] == 1.0
    planner.timed(False, seconds=2 * predicted * 200 / 1000, passes=200, source_passes=200)
    assert planner.factor[False] == pytest.approx(2.0)
    assert planner.speedup(1) == pytest.approx(before)  # speculation untimed: as far off
    planner.timed(True, seconds=1.0, passes=1, source_passes=1)  # its first: ignored
    assert planner.speedup(1) == pytest.approx(before)
    planner.timed(
        True, seconds=planner.pass_ms(True, 1) * 200 / 1000, passes=200, source_passes=200
    )
    assert planner.speedup(1) == pytest.approx(2 * before)
    spec = planner.pass_ms(True, 4)
    planner.timed(True, seconds=3 * spec * 50 / 1000, passes=50, source_passes=200)
    assert planner.factor[True] == pytest.approx(1 + 0.25 * (3 - 1))  # 50 passes weigh 1/4


def test_the_first_timed_passes_set_the_factor_as_their_mean() -> None:
    """Until 200 passes are timed the factor is their mean, not a slow drift from 1: a
    speculative factor still near 1 while the plain one had reached 3 once priced
    speculation at 2.2x when it ran at 0.9x."""
    planner = Planner(CPU, beam_size=5, shape=PassShape(tau=2.0))
    spec = planner.pass_ms(True, 1)
    planner.timed(True, seconds=1.0, passes=1, source_passes=1)  # the first: ignored
    planner.timed(True, seconds=3 * spec * 10 / 1000, passes=10, source_passes=10)
    assert planner.factor[True] == pytest.approx(3.0)
    planner.timed(True, seconds=1 * spec * 30 / 1000, passes=30, source_passes=30)
    assert planner.factor[True] == pytest.approx((3 * 10 + 1 * 30) / 40)


def test_generator_times_both_kinds_of_call(tiny_target, tiny_draft, vocab_info, monkeypatch):
    """Speculative and plain calls report their times (the decision itself is fixed here:
    the tiny models' times would move it)."""
    generator = SpeculativeBeamSearchSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, config=ON_CPU, beam_size=4, gamma=3, plain="lean"
    )
    planner = generator.planner
    assert planner is not None
    monkeypatch.setattr(planner, "speculate", lambda num_sources: num_sources == 1)
    beam = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=4)
    for _ in range(2):
        for n, speculative in ((1, True), (16, False)):
            assert_plain_iff_not(speculative, generator, beam, batch=n, seed=43)
    assert planner._timed_calls == {False: 2, True: 2}
    assert planner.factor[False] != 1.0 and planner.factor[True] != 1.0


def test_a_speculative_call_is_priced_at_its_own_trees() -> None:
    """A call that drafted bigger trees than the running mean took longer as predicted for
    those trees: the machine is no slower than calibrated."""
    planner = Planner(CPU, beam_size=5, shape=PassShape(tau=2.0))
    big = PassShape(tau=2.0, slots=60.0, draft_calls=4.0, draft_slots=10.0)
    assert planner.pass_ms(True, 1, big) > planner.pass_ms(True, 1)
    planner.timed(True, seconds=1.0, passes=1, source_passes=1)  # the first: ignored
    seconds = planner.pass_ms(True, 1, big) * 10 / 1000
    planner.timed(True, seconds=seconds, passes=10, source_passes=10, shape=big)
    assert planner.factor[True] == pytest.approx(1.0)


def _gate(tau: float = 2.0, depth: int = 3) -> Gate:
    shape = DraftShape(depth=depth, width=4, beam_size=4)
    return Gate(Planner(CPU, beam_size=4, shape=PassShape(tau=tau)), shape)


def test_gate_learns_coverage_per_confidence_from_the_levels_each_pass_saw() -> None:
    """A pass of depth d that advanced s steps covered levels < s, missed level s when
    s ≤ d, and says nothing of levels below d when it took them all."""
    gate = _gate()
    before = gate.reached.clone(), gate.covered.clone()
    conf = torch.tensor([0.95, 0.95, 0.05])
    gate.observe(conf, depths=torch.tensor([2, 3, 3]), steps=torch.tensor([3, 2, 1]))
    reached, covered = gate.reached - before[0], gate.covered - before[1]
    assert reached[9].tolist() == [2, 2, 0] and covered[9].tolist() == [2, 1, 0]
    assert reached[0].tolist() == [1, 0, 0] and covered[0].tolist() == [0, 0, 0]
    assert reached[1:9].abs().sum() == 0


def test_gate_speculates_where_confidence_has_covered_and_steps_plain_elsewhere() -> None:
    """After passes where confident first levels covered every level and unsure ones
    none, a confident source drafts its whole depth, an unsure one takes a plain step."""
    gate = _gate(depth=3)
    for _ in range(50):
        gate.observe(torch.tensor([0.97, 0.2]), torch.tensor([3, 3]), torch.tensor([4, 1]))
    tau = gate.tau(torch.tensor([0.97, 0.2]))
    assert tau[0].tolist() == pytest.approx([1, 2, 3, 4], abs=0.2)
    assert tau[1].tolist() == pytest.approx([1, 1, 1, 1], abs=0.1)
    assert gate.depths(torch.tensor([0.97, 0.2]), torch.tensor([3, 3])).tolist() == [3, 0]
    assert gate.depths(torch.tensor([0.97]), torch.tensor([2])).tolist() == [
        2
    ]  # its own depth caps


def test_gate_prices_depths_with_the_planners_costs() -> None:
    """A plain step here pays the first-level draft call too; each depth is the planner's
    price of its tree."""
    gate = _gate(depth=2)
    ms = gate.pass_ms(1).tolist()
    assert ms[0] == pytest.approx(CPU.plain_ms(4) + CPU.draft.ms(4))
    shape = PassShape.expected(DraftShape(depth=2, width=4, beam_size=4), 1.0)
    assert ms[2] == pytest.approx(CPU.pass_ms(True, 4, 1, shape))
    gate.planner.factor[True] = 2.0
    gate.planner._timed_calls[True] = 2
    assert gate.pass_ms(1)[2] == pytest.approx(2 * ms[2])


def test_gate_probes_close_passes_and_never_clear_losses() -> None:
    """A source priced just below break-even speculates on every 8th such pass, so that
    its bin stays measured; one far below never does."""
    gate = _gate(depth=1)
    ms = gate.pass_ms(1)
    for conf, speed in ((0.55, 0.95), (0.05, 0.5)):
        q = speed * float(ms[1] / ms[0]) - 1  # τ(1) = 1 + q
        b = int(conf * 10)
        gate.reached[b], gate.covered[b] = 1000.0, 1000.0 * q
    close = [int(gate.depths(torch.tensor([0.55]), torch.tensor([1]))) for _ in range(16)]
    assert close.count(1) == 2
    assert not any(int(gate.depths(torch.tensor([0.05]), torch.tensor([1]))) for _ in range(16))


def test_gated_generator_gives_beam_search_and_gates_off_a_draft_that_never_covers(
    tiny_target, untrained_draft, copy_draft, vocab_info
) -> None:
    """With `gate`, a draft that never covers the target's beam soon takes plain steps
    (few verified slots per pass), the target as its own draft keeps speculating; both
    give beam search's output."""
    # Verified tokens cost in full: a tree must advance more than 1.2 steps to pay.
    costs = {**STORED, "target": [10.3, 1.0]}
    config = SpeculativeSearchConfig(machine=MachineSettings(costs=costs))
    beam = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=4)
    slots = {}
    for name, draft in (("untrained", untrained_draft), ("copy", copy_draft)):
        generator = SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, draft, vocab_info, config=config, beam_size=4, gamma=3, plan=False,
            gate=True, plan_tau=2.5,
        )  # fmt: skip
        for seed in range(50, 54):
            assert_plain_iff_not(True, generator, beam, batch=1, seed=seed)
        src, src_layout = pad(sources(seed=60, batch=1), 0)
        prompts, prompt_layout = pad([NLLB_PROMPT], 0)
        out = generator(src, src_layout, prompts, prompt_layout)
        assert_same(beam(src, src_layout, prompts, prompt_layout), out)
        slots[name] = out.stats.verified_slots / out.stats.source_passes, out.stats.tau
    assert slots["untrained"][0] < 4 + 1.5  # mostly the 4 roots alone
    assert slots["copy"][0] > 4 + 4 and slots["copy"][1] > 2.0
