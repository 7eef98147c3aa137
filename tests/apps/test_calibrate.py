"""Calibration's timed calls, the hardware config it writes, and hardware=cpu's planner."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbeam.apps import calibrate as calibrate_app
from specbeam.apps.calibrate import (
    Calibration,
    CallTimer,
    GridRow,
    OtherLoad,
    calibrate,
    ceiling_table,
    never_accepted,
    trusted,
    usage,
    write_hardware,
)
from specbeam.apps.decoding import DecodingConfig, load_decoding
from specbeam.apps.evaluate import EvaluateConfig
from specbeam.apps.hardware import HardwareConfig, load_hardware
from specbeam.integration.models import build_model
from specbeam.search.config import SpeculativeSearchConfig
from specbeam.search.planner import LinearCost, PassShape, PlanCosts, Planner
from tests.conftest import TARGET_ARCH, sources

REPO = Path(__file__).resolve().parents[2]


@torch.inference_mode()
def test_timed_calls_are_rolled_back_to_the_same_prefix() -> None:
    timer = CallTimer(build_model(TARGET_ARCH).eval(), sources(0, 1)[0], hyps=5, prefix_len=7,
                      max_slots=25)  # fmt: skip
    cache = timer.decoder.cache
    for slots in (25, 1, 10):
        assert timer(slots) > 0
        assert cache.lens.tolist() == [7] and cache.spec_len == 0


def compose_config(name: str, overrides: list[str]) -> object:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return OmegaConf.to_object(compose(name, overrides=overrides))


@pytest.fixture
def idle_machine(monkeypatch) -> None:
    """No other process counted busy (tests may run beside others): a tiny target's timed
    calls cost more than inside a search, and its work beside the calls is written as 0
    rather than refused as a busy machine's (`trusted`). Its calls cost so little that a
    noisy run may fit one to cost nothing, which calibrate rightly refuses
    (`test_costs_that_cannot_be_trusted_are_not_written`): such a run skips, saying so."""
    monkeypatch.setattr(OtherLoad, "cpus", lambda self: 0.0)
    check = calibrate_app.trusted

    def trusted_or_skip(*args: object, **kwargs: object) -> object:
        try:
            return check(*args, **kwargs)
        except ValueError as error:
            if "fitted to cost nothing" not in str(error):
                raise
            pytest.skip(f"the machine was too noisy for a tiny target's fit: {error}")

    monkeypatch.setattr(calibrate_app, "trusted", trusted_or_skip)


def test_calibrate_writes_a_loadable_hardware_config(
    tmp_path, capsys, monkeypatch, idle_machine
) -> None:
    """By default into the per-user configs, where `hardware=NAME` finds it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    cfg = compose_config("calibrate", [
        "model=tiny_random", "hardware.threads=1", "name=cal_test",
        "gammas=[2,5]", "draft_widths=[5,6]", "sample=2", "repeats=2", "slot_counts=[1,5,10]",
    ])  # fmt: skip
    path = calibrate(cfg)
    assert path == tmp_path / "specbeam" / "hardware" / "cal_test.yaml"
    printed = capsys.readouterr().out
    assert "verify (target, float32)" in printed and "| γ | width | τ |" in printed
    assert printed.count("| 2 | 5 |") + printed.count("| 5 | 6 |") == 2
    assert path.read_text().startswith("# Written by `python -m specbeam.calibrate`")
    assert "beside the calls" in printed and "| beside ms/pass |" in printed
    assert "| breaks even at τ |" in printed and "The ceiling: a perfect draft's trees" in printed
    assert "| γ 8, width 5, perfect draft |" in printed
    peak = re.search(r"peak resident memory: (\d+) MiB", printed)
    assert peak is not None and int(peak.group(1)) > 100  # torch and fairseq2 alone take more

    assert f"wrote {path} (use: hardware=cal_test)" in printed
    loaded = compose_config("evaluate", ["hardware=cal_test"])
    assert isinstance(loaded, EvaluateConfig)
    hw = loaded.hardware
    assert (hw.name, hw.threads, hw.batch_tokens, hw.draft_dtype) == (
        "cal_test", 1, 1024, "auto",
    )  # fmt: skip
    tuned = hw.tune(load_decoding("spec_beam"))
    assert tuned.gamma in (2, 5) and tuned.draft_width in (5, 6)
    # hardware=cpu's adaptive bounds [1, 4] are kept, widened where the best γ lies beyond
    assert tuned.gamma_bounds == [1, max(4, tuned.gamma)]
    # The planner runs on the costs calibration measured, τ as the best cell saw it.
    planner = SpeculativeSearchConfig(tuned, hw).planner()
    assert planner is not None and planner.shape.tau == tuned.plan_tau > 0
    assert planner.costs.target == LinearCost(*hw.costs["target"])
    assert hw.tune(load_decoding("spec_sample")) == load_decoding("spec_sample")  # not tuned


def test_calibrates_any_speculative_method(tmp_path, idle_machine) -> None:
    """`method=` names the decoding to tune (`decoding=` is the apps' config group, and
    Hydra refuses it here); the file holds its tuned settings alone: hardware=cpu's other
    entries were measured for another pair."""
    cfg = compose_config("calibrate", [
        "model=tiny_random", "hardware.threads=1", "name=cal_greedy", "method=spec_greedy",
        f"hardware_dir={tmp_path}", "gammas=[2,3]", "draft_widths=[1]", "sample=2", "repeats=2",
        "slot_counts=[1,5]",
    ])  # fmt: skip
    text = calibrate(cfg).read_text()
    assert "# spec_greedy: best γ=" in text
    tuned = OmegaConf.load(tmp_path / "cal_greedy.yaml").tuned
    assert set(tuned) == {"spec_greedy"}
    assert tuned.spec_greedy.gamma in (2, 3) and tuned.spec_greedy.draft_width == 1
    assert "other decodings run with their decoding files' settings" in text
    # Not calibrated here: spec_beam runs on its decoding file's settings, and the planner
    # on the measured costs from its default guess of τ.
    hw = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.create(text))
    )
    spec_beam = hw.tune(load_decoding("spec_beam"))
    assert spec_beam == load_decoding("spec_beam")
    planner = SpeculativeSearchConfig(spec_beam, hw).planner()
    assert planner is not None and planner.shape.tau == DecodingConfig().plan_tau


def test_calibrating_a_users_config_again_keeps_what_it_measured_before(
    tmp_path, monkeypatch, idle_machine
) -> None:
    """A second method calibrated on the user's own config (found per user, by name) adds
    its tuned settings to the first's rather than dropping them."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    common = ["model=tiny_random", "hardware.threads=1", "name=mine", "sample=2", "repeats=2",
              "slot_counts=[1,5]", "gammas=[2]"]  # fmt: skip
    calibrate(compose_config("calibrate", [*common, "method=spec_greedy", "draft_widths=[1]"]))
    text = calibrate(compose_config("calibrate", [*common, "hardware=mine", "draft_widths=[5]"]))
    tuned = OmegaConf.load(text).tuned
    assert set(tuned) == {"spec_greedy", "spec_beam"}
    assert tuned.spec_greedy.draft_width == 1 and tuned.spec_beam.draft_width == 5
    assert "(and, from hardware=mine, spec_greedy)" in text.read_text()


def test_tuned_settings_must_be_decoding_settings() -> None:
    hw = HardwareConfig(tuned={"spec_beam": {"depth": 3}})
    with pytest.raises(ValueError, match="unknown settings: depth"):
        hw.tune(load_decoding("spec_beam"))


def test_cpu_config_plans_exact_and_relaxed_decodings() -> None:
    """hardware=cpu's cost model: exact spec_beam speculates one sentence at a time and runs
    plain search for batches (compute-bound verification); relaxed, planned on its own
    higher τ, speculates one sentence at a time, not for batches."""
    hardware = load_hardware("cpu")

    def planner(decoding: DecodingConfig) -> Planner | None:
        return SpeculativeSearchConfig(decoding, hardware).planner()

    spec_beam = planner(hardware.tune(load_decoding("spec_beam")))
    assert spec_beam is not None and spec_beam.speedup(16) < 0.5 < spec_beam.speedup(1)
    relaxed = planner(hardware.tune(load_decoding("relaxed")))
    assert relaxed is not None and relaxed.shape.tau > spec_beam.shape.tau
    assert relaxed.speedup(16) < 1 < relaxed.speedup(1)
    assert relaxed.speedup(1) > spec_beam.speedup(1)
    assert planner(load_decoding("spec_beam:plan=false")) is None
    with pytest.raises(ValueError, match="hardware=gpu9 is unknown; allowed: cpu"):
        load_hardware("gpu9")


CALLS = {"target": {1: 11.5, 25: 47.5}, "draft": {1: 3.4, 10: 7.0}}


@pytest.mark.parametrize("beside_ms", [2.5, -13.8])
def test_costs_are_written_with_no_negative_work_beside_the_calls(tmp_path, beside_ms) -> None:
    """The planner's costs are the calibrated ones; searches faster than their own timed
    calls on an idle machine (a timed call of a large or tiny target costs more than inside
    a search) would price a pass below its calls: that work is written as 0 (and printed
    so), and the config says why."""
    cfg = compose_config("calibrate", [f"hardware_dir={tmp_path}", "name=cal"])
    plan = PlanCosts(LinearCost(10.0, 1.5), LinearCost(3.0, 0.4), beside_ms, plain_step_ms=2.5)
    cal = trusted(Calibration(plan, CALLS, fairseq2_step_ms=48.0), tmp_path / "cal.yaml", 0.02, 0.5)
    shape = PassShape(tau=2.0, slots=25.0, draft_calls=2.0, draft_slots=10.0)
    best = GridRow(2, 10, shape, 3.0, beside_ms, 2.5, 0.6, 0.65, 1.9)
    path = write_hardware(cfg, "spec_beam", 5, best, cal, [1, 4])
    written = OmegaConf.load(path)
    assert written.tuned.spec_beam.gamma == 2 and written.tuned.spec_beam.plan_tau == 2.0
    costs = OmegaConf.to_container(written.costs)
    assert costs == {"target": [10.0, 1.5], "draft": [3.0, 0.4],
                     "accept_ms": max(beside_ms, 0.0), "plain_step_ms": 2.5}  # fmt: skip
    said = "work beside the calls written as 0 where it came out negative (-13.80 ms per spec"
    assert (said in (cal.raised or "")) == (said in path.read_text()) == (beside_ms < 0)


@pytest.mark.parametrize(
    ("others", "cause"),
    [
        (
            1.6,
            "other processes kept 1.6 of this machine's 2 CPUs busy on average while it measured",
        ),
        (None, "the machine's speed changed while it measured"),
    ],
)
def test_costs_that_cannot_be_trusted_are_not_written(tmp_path, monkeypatch, others, cause) -> None:
    """Other processes slowed the timed calls more than the searches: work beside the calls
    below zero, and the screen's costs would differ from those written. One line names the
    file not written and the cause (fewer busy CPUs than `busy_cpus`: written as 0); a call
    fitted to cost nothing is refused on any machine."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    plan = PlanCosts(LinearCost(440.0, 2.3), LinearCost(3.0, 0.4), -590.86, plain_step_ms=-259.4)
    cal = Calibration(plan, CALLS, fairseq2_step_ms=480.0)
    path = tmp_path / "my_nllb.yaml"
    if others is not None:
        with pytest.raises(ValueError) as refused:
            trusted(cal, path, others, 0.5)
        assert str(refused.value) == (
            f"calibration cannot be trusted, so {path} was not written: the work beside the "
            "calls came out negative (-590.86 ms per speculative pass, -259.40 ms per plain "
            "step), as the timed calls and the searches ran at different speeds "
            f"({cause}); run it again on an idle machine"
        )
        assert trusted(cal, path, others, busy_cpus=2.0).raised is not None  # below the bar
    free = Calibration(PlanCosts(LinearCost(-2.0, 0.1), plan.draft, 1.0, 1.0), CALLS, 48.0)
    with pytest.raises(ValueError) as refused:
        trusted(free, path, others, 0.5)
    assert str(refused.value) == (
        f"calibration cannot be trusted, so {path} was not written: a target call fitted to "
        f"cost nothing, as its timings varied more than it costs ({cause}); run it again on "
        "an idle machine"
    )
    assert not path.exists()


def test_other_processes_cpu_time_is_measured() -> None:
    """A busy loop in a child process counts as another's CPU time, this process's not."""
    load = OtherLoad()
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() < t + 0.6: pass"]
    )
    child.wait()
    cpus = load.cpus()
    assert cpus is not None and 0.3 < cpus < (os.cpu_count() or 1) + 0.5  # ticks are coarse


def test_the_closing_hint_names_the_searchpath_a_directory_needs(tmp_path, monkeypatch) -> None:
    """Verified by composing with it: Hydra finds `hardware/NAME.yaml` under the entry."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "w" / "hardware" / "my_nllb.yaml"
    path.parent.mkdir(parents=True)
    path.write_text("name: my_nllb\nthreads: 1\n")
    hint = usage(path)
    assert hint == f"hardware=my_nllb 'hydra.searchpath=[file://{tmp_path}/w]'"
    loaded = compose_config("evaluate", shlex.split(hint))
    assert isinstance(loaded, EvaluateConfig) and loaded.hardware.name == "my_nllb"
    assert usage(tmp_path / "config" / "specbeam" / "hardware" / "a.yaml") == "hardware=a"
    assert "after moving it to" in usage(tmp_path / "elsewhere" / "a.yaml")


def test_a_shipped_hardware_name_is_refused() -> None:
    cfg = compose_config("calibrate", ["name=cpu"])
    with pytest.raises(ValueError, match="name=cpu is a shipped hardware config"):
        calibrate(cfg)


def test_a_draft_the_target_never_takes_is_named() -> None:
    """An untrained head or one of another target: every cell's τ is about 1. The line ends
    with what the planner does with the costs written: a pass of one step may still cost
    less than a plain step, and then it speculates."""

    def row(tau: float, predicted: float = 0.4) -> GridRow:
        return GridRow(2, 5, PassShape(tau=tau), 0.5, 0.5, 2.0, predicted, 0.3, 0.3)

    taken = "the target took almost none of the draft's tokens (τ ≤ 1.02 at every γ and width): "
    assert never_accepted([row(1.0), row(1.02)], row(1.0)) == (
        f"{taken}the draft is untrained or made for another target; the planner will run "
        "plain search (predicted 0.40× plain search at γ 2, width 5)"
    )
    assert never_accepted([row(1.0), row(1.02)], row(1.0, 1.18)) == (
        f"{taken}the draft is untrained or made for another target; the planner will still "
        "speculate at batch 1, as a pass costs less than a plain step here (predicted 1.18× "
        "plain search at γ 2, width 5)"
    )
    assert never_accepted([row(1.0), row(1.6)], row(1.6)) is None


def test_ceiling_prices_a_perfect_draft_as_the_planner_does() -> None:
    """Target 10 + 0.2·T ms, draft calls 2 ms, 4 ms per pass beside the calls, a plain
    step 12 ms: a perfect γ 4 / width 5 tree verifies 25 tokens with 4 draft calls
    (27 ms) for τ 5, and breaks even at τ 27 / 12."""
    costs = PlanCosts(LinearCost(10.0, 0.2), LinearCost(2.0, 0.0), 4.0, plain_step_ms=1.0)
    seen = PassShape(tau=2.0, slots=25.0, draft_calls=2.0, draft_slots=10.0)
    out = ceiling_table(costs, 5, fairseq2_step_ms=13.2, seen=("γ 2, width 10, measured", seen))
    assert "lean plain step 12.00 ms, fairseq2's beam step 13.20 ms, 4.00 ms" in out
    rows = {line.split(" | ")[0][2:]: line for line in out.splitlines() if line.startswith("| γ")}
    assert rows["γ 2, width 10, measured"] == (
        "| γ 2, width 10, measured | 25.0 | 2.00 | 23.0 | 2.00 | 1.92 | 11.50 | 1.04× | 1.15× |"
    )
    assert rows["γ 4, width 5, perfect draft"] == (
        "| γ 4, width 5, perfect draft | 25.0 | 4.00 | 27.0 | 5.00 | 2.25 | 5.40 | 2.22× | 2.44× |"
    )
    assert rows["γ 1, width 5, perfect draft"] == (
        "| γ 1, width 5, perfect draft | 10.0 | 1.00 | 18.0 | 2.00 | 1.50 | 9.00 | 1.33× | 1.47× |"
    )
    assert len(rows) == 1 + 6
    assert "τ 1.92 breaks even with lean plain search, τ 2.61 gives 1.5×" in out
    # Against a slow baseline a pass of one step is already fast enough: no τ below 1.
    slow = ceiling_table(costs, 5, fairseq2_step_ms=40.0, seen=("γ 2, width 10, measured", seen))
    assert "τ 1.92 breaks even with lean plain search, τ 1 already gives 1.74× fairseq2's" in slow
