"""The search's one configuration: defaults, keywords, validation, the planner it builds."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.recipe.config import BeamSearchConfig

from specbeam.kernels.runtime import RuntimeConfig
from specbeam.search.config import (
    BeamSettings,
    MachineSettings,
    SearchSettings,
    SettingError,
    SpeculativeSearchConfig,
    settings_of,
)

STORED = {"target": [10.3, 0.3], "draft": [1.9, 0.03], "accept_ms": 1.0, "plain_step_ms": 1.5}


def test_beam_settings_are_fairseq2s_own() -> None:
    """The names of fairseq2's BeamSearchConfig (bar `algo`) and the defaults of its
    BeamSearchSeq2SeqGenerator, so that a drop-in generator's keyword arguments mean what
    fairseq2's mean."""
    ours = {f.name: f.default for f in dataclasses.fields(BeamSettings)}
    names = {f.name for f in dataclasses.fields(BeamSearchConfig)} - {"algo"}
    keywords = inspect.signature(BeamSearchSeq2SeqGenerator).parameters
    assert ours == {name: keywords[name].default for name in names}


def test_keywords_replace_search_settings_by_name() -> None:
    base = SpeculativeSearchConfig(machine=MachineSettings(onednn=False))
    config = SpeculativeSearchConfig.of(base, beam_size=3, gamma=2, relax_top=4)
    assert (config.search.beam_size, config.search.gamma, config.search.relax_top) == (3, 2, 4)
    assert config.machine.onednn is False  # untouched
    assert SpeculativeSearchConfig.of(base) is base
    with pytest.raises(TypeError, match="unknown search settings: planner"):
        SpeculativeSearchConfig.of(planner=None)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"relax_top": -1}, "`relax_top` must be ≥ 0"),
        ({"relax_gap": -1.0}, "`relax_gap` must be ≥ 0"),
        ({"plain": "fast"}, "`plain` must be one of"),
        ({"draft_width": 3}, "`draft_width` must be ≥ beam_size (5)"),
        ({"gamma": 0}, "`gamma` must be ≥ 1"),
        ({"max_speculative_batch": 2, "relax_top": 3}, "must be 0 with relaxed acceptance"),
    ],
)
def test_bad_search_settings_name_the_setting(settings, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SpeculativeSearchConfig.of(**settings).validate()


def test_bad_machine_settings_name_the_setting_when_made() -> None:
    for settings, message in (
        ({"memory_budget_mb": -1}, "`memory_budget_mb` must be ≥ 0"),
        ({"onednn_min_rows": 0}, "`onednn_min_rows` must be ≥ 1 or None"),
    ):
        with pytest.raises(SettingError, match=message):
            MachineSettings(**settings)


def test_a_config_is_checked_when_made_and_makes_its_draft_shape_once() -> None:
    with pytest.raises(SettingError, match="`gamma` must be ≥ 1, but is 0.") as error:
        SpeculativeSearchConfig(SearchSettings(gamma=0))
    assert (error.value.setting, error.value.value, error.value.allowed) == ("gamma", 0, "≥ 1")
    config = SpeculativeSearchConfig(SearchSettings(gamma=3, beam_size=4))
    assert config.draft_shape == config.search.draft_shape()
    assert config.planner() is None and config == SpeculativeSearchConfig(config.search)


def test_the_draft_shape_takes_its_defaults_from_the_beam() -> None:
    assert SearchSettings(beam_size=4).draft_shape().width == 4
    assert SearchSettings(beam_size=4, draft_strategy="topm").draft_shape().width == 8
    shape = SearchSettings(gamma=2, gamma_bounds=(1, 4)).draft_shape()
    assert (shape.depth, shape.depth_bounds, shape.max_depth) == (2, (1, 4), 4)


def test_a_planner_only_with_costs_for_planned_search() -> None:
    machine = MachineSettings(costs=STORED)
    planner = SpeculativeSearchConfig(SearchSettings(plan_tau=2.5, beam_size=4), machine).planner()
    assert planner is not None and (planner.k, planner.shape.tau) == (4, 2.5)
    assert SpeculativeSearchConfig().planner() is None  # no costs
    assert SpeculativeSearchConfig(SearchSettings(plan=False), machine).planner() is None
    relaxed = SearchSettings(relax_top=3, plan_tau=3.5)
    planner = SpeculativeSearchConfig(relaxed, machine).planner()
    assert planner is not None and planner.shape.tau == 3.5  # relaxed plans on its own τ
    broken = MachineSettings(costs={"target": [1.0, 0.1]})
    with pytest.raises(ValueError, match="hardware.costs is incomplete"):
        SpeculativeSearchConfig(machine=broken).planner()


def test_machine_settings_carry_the_runtime_and_the_budget() -> None:
    machine = MachineSettings(native=False, spare_cache_mb=1, memory_budget_mb=0.5)
    assert machine.runtime_config() == RuntimeConfig(native=False, spare_cache_mb=1)
    assert machine.memory_budget_bytes == 2**19
    assert MachineSettings().memory_budget_bytes is None


def test_settings_of_copies_same_named_fields() -> None:
    """The extension's generator config carries the search settings by name."""

    @dataclasses.dataclass
    class Carrier:
        beam_size: int = 3
        gamma: int = 2
        draft_model: str = "draft"

    settings = settings_of(SearchSettings, Carrier(), lean_target=False)
    assert (settings.beam_size, settings.gamma, settings.lean_target) == (3, 2, False)
