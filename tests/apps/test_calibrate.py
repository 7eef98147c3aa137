"""Calibration's timed calls, the hardware config it writes, and the benchmark scripts."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbeam.apps.calibrate import Calibration, CallTimer, GridRow, calibrate, write_hardware
from specbeam.apps.decoding import DecodingConfig, load_decoding
from specbeam.apps.evaluate import EvaluateConfig
from specbeam.apps.hardware import HardwareConfig, load_hardware
from specbeam.integration.models import ModelPairConfig, build_model
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


def test_calibrate_writes_a_loadable_hardware_config(tmp_path, capsys) -> None:
    cfg = compose_config("calibrate", [
        "model=tiny_random", "hardware.threads=1", "name=cal_test", f"hardware_dir={tmp_path}/hardware",
        "gammas=[2,3]", "draft_widths=[5,6]", "sample=2", "repeats=2", "slot_counts=[1,5,10]",
    ])  # fmt: skip
    path = calibrate(cfg)
    assert path == tmp_path / "hardware" / "cal_test.yaml"
    printed = capsys.readouterr().out
    assert "verify (target, fp32)" in printed and "| γ | width | τ |" in printed
    assert printed.count("| 2 | 5 |") + printed.count("| 3 | 6 |") == 2
    assert path.read_text().startswith("# Written by `python -m specbeam.calibrate`")
    assert "beside the calls" in printed and "| beside ms/pass |" in printed

    loaded = compose_config(
        "evaluate", ["hardware=cal_test", f"hydra.searchpath=[file://{tmp_path}]"]
    )
    assert isinstance(loaded, EvaluateConfig)
    hw = loaded.hardware
    assert (hw.name, hw.threads, hw.batch_tokens, hw.draft_dtype) == (
        "cal_test", 1, 1024, "auto",
    )  # fmt: skip
    tuned = hw.tune(load_decoding("spec_beam"))
    assert tuned.gamma in (2, 3) and tuned.draft_width in (5, 6)
    assert tuned.gamma_bounds == [1, 4]  # hardware=cpu's other tuned settings are kept
    # The planner runs on the costs calibration measured, τ as the best cell saw it.
    planner = SpeculativeSearchConfig(tuned, hw).planner()
    assert planner is not None and planner.shape.tau == tuned.plan_tau > 0
    assert planner.costs.target == LinearCost(*hw.costs["target"])
    assert hw.tune(load_decoding("spec_sample")) == load_decoding("spec_sample")  # not tuned


def test_calibrates_any_speculative_method(tmp_path) -> None:
    """`method=` names the decoding to tune (`decoding=` is the apps' config group, and
    Hydra refuses it here); its tuned settings sit beside those of other methods."""
    cfg = compose_config("calibrate", [
        "model=tiny_random", "hardware.threads=1", "name=cal_greedy", "method=spec_greedy",
        f"hardware_dir={tmp_path}", "gammas=[2,3]", "draft_widths=[1]", "sample=2", "repeats=2",
        "slot_counts=[1,5]",
    ])  # fmt: skip
    text = calibrate(cfg).read_text()
    assert "# spec_greedy: best γ=" in text
    tuned = OmegaConf.load(tmp_path / "cal_greedy.yaml").tuned
    assert {"spec_beam", "relaxed"} <= set(tuned)  # hardware=cpu's own entries are kept
    assert tuned.spec_greedy.gamma in (2, 3) and tuned.spec_greedy.draft_width == 1


def test_tuned_settings_must_be_decoding_settings() -> None:
    hw = HardwareConfig(tuned={"spec_beam": {"depth": 3}})
    with pytest.raises(ValueError, match="unknown settings: depth"):
        hw.tune(load_decoding("spec_beam"))


def test_bench_quick_prints_every_goal(tmp_path) -> None:
    cmd = [sys.executable, "scripts/bench.py", "--quick", "--out", str(tmp_path)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for row in (
        "| spec_beam 5 as configured (planner: ",
        "| kernel gain: specbeam's plain beam 5 (lean) vs fairseq2's, batch 1 |",
        "| speculation gain: spec_beam 5 always speculating vs lean plain, batch 1 |",
        "| spec beam 5, batch 1: τ at γ=",
        "| efficiency: measured ÷ predicted speculation gain |",
        "| spec_beam 5 as configured, batches of 16: sentences/s vs beam |",
        "| spec greedy as configured vs greedy, batch 1: wall time |",
        "| relaxed beam 5, batch 1: wall time |",
        "| peak KV cache, self + cross attention (target + draft) ÷ beam's |",
        "| ms per pass | fairseq2 target modules | lean target |",
    ):
        assert row in result.stdout + (tmp_path / "bench.md").read_text()
    for exact in ("spec_beam 5 as configured", "specbeam's plain beam 5 (lean)",
                  "spec_beam 5 always speculating"):  # fmt: skip
        assert f"| {exact}, batch 1: identical output | – | 1.000 identical |" in result.stdout
    for name in ("bench.md", "bench.json", "bench.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_bench_names_missing_checkpoints_in_one_line(monkeypatch) -> None:
    bench = _script("bench", monkeypatch)
    pair = ModelPairConfig(name="future", target="tasks/none/target.pt", draft="random")
    with pytest.raises(
        SystemExit, match="checkpoint tasks/none/target.pt does not exist yet.*tiny_random"
    ):
        bench.check_checkpoints(pair)


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


def _script(name: str, monkeypatch):  # noqa: ANN001, ANN202
    """A script loaded by path, registered as its module name while the test runs
    (dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_ceiling_prices_a_perfect_draft_from_the_bench_costs(monkeypatch) -> None:
    """Target 10 + 0.2·T ms, draft calls 2 ms, 4 ms per pass beside the calls: a perfect
    γ 2 / width 10 tree verifies 25 tokens with 2 draft calls (23 ms) for τ 3."""
    record = {
        "cost_model": {"verify": {"a": 10.0, "b": 0.2}, "draft": {"a": 2.0, "b": 0.0}, "step_ms": 13.2},
        "pass_breakdown": {"lean target": {"acceptance": 2.0, "cache commit": 1.0, "other": 1.0}},
        "lean_plain_step_ms": 12.0,
        "pass_profile": {"slots": 25.0, "draft_calls": 2.0, "draft_slots": 10.0, "tau": 2.0},
    }  # fmt: skip
    out = _script("ceiling", monkeypatch).table(record)
    assert "| today, measured τ | 25.0 | 2.00 | 23.0 | 2.00 | 11.50 | 1.04× | 1.15× |" in out
    assert (
        "| γ 2, width 10, perfect draft | 25.0 | 2.00 | 23.0 | 3.00 | 7.67 | 1.57× | 1.72× |" in out
    )
    assert (
        "| γ 4, width 5, perfect draft | 25.0 | 4.00 | 27.0 | 5.00 | 5.40 | 2.22× | 2.44× |" in out
    )
    assert "τ 1.92 breaks even with lean plain search, τ 2.61 gives 1.5×" in out


@pytest.mark.parametrize("beside_ms", [2.5, -4.8])
def test_costs_are_written_unless_the_runs_contradict_them(tmp_path, caplog, beside_ms) -> None:
    """The planner's costs are the calibrated ones; but runs faster than their own timed
    calls (the machine's speed changed in between) would price a pass below its calls, so
    then the config keeps its costs and says why."""
    cfg = compose_config("calibrate", [f"hardware_dir={tmp_path}", "name=cal"])
    plan = PlanCosts(LinearCost(10.0, 1.5), LinearCost(3.0, 0.4), beside_ms, plain_step_ms=2.5)
    shape = PassShape(tau=2.0, slots=25.0, draft_calls=2.0, draft_slots=10.0)
    best = GridRow(2, 10, shape, 3.0, beside_ms, 0.6, 0.65, 1.9)
    path = write_hardware(cfg, "spec_beam", 5, best, Calibration(plan, {}, fairseq2_step_ms=48.0))
    written = OmegaConf.load(path)
    assert written.tuned.spec_beam.gamma == 2 and written.tuned.spec_beam.plan_tau == 2.0
    costs = OmegaConf.to_container(written.costs)
    if beside_ms > 0:
        assert costs == {"target": [10.0, 1.5], "draft": [3.0, 0.4], "accept_ms": 2.5,
                         "plain_step_ms": 2.5}  # fmt: skip
        assert "costs not written" not in path.read_text()
    else:
        assert costs == load_hardware("cpu").costs
        assert "costs not written" in caplog.text and "# costs not written" in path.read_text()
