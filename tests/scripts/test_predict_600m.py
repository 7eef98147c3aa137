"""scripts/predict_600m.py's parts that need no 600M model: the --tau items, the searches
as this machine tunes them with the planner off, the CPU's name and the example verse."""

from __future__ import annotations

import pytest

from specbeam.apps.decoding import load_decoding
from specbeam.apps.hardware import load_hardware


def test_taus_name_every_search_and_repeat_rows(script) -> None:
    parse = script("predict_600m").parse_taus
    items = ["spec_beam=2.16", "spec_greedy=2.33", "relaxed=3.36", "relaxed=2.8"]
    assert parse(items) == {"spec_beam": [2.16], "spec_greedy": [2.33], "relaxed": [3.36, 2.8]}
    with pytest.raises(SystemExit, match="--tau beam=2: the search is one of spec_beam, "):
        parse(["beam=2", *items])
    with pytest.raises(SystemExit, match="--tau is missing for relaxed, spec_greedy"):
        parse(["spec_beam=2.16"])


def test_searches_are_tuned_capped_and_unplanned(script) -> None:
    hw = load_hardware("cpu")
    tuned = hw.tune(load_decoding("spec_beam"))
    decoding = script("predict_600m").decoding
    config = decoding(hw, "spec_beam", 30)
    assert (config.gamma, config.draft_width) == (tuned.gamma, tuned.draft_width)
    assert tuple(config.max_gen_len) == (0.0, 30) and not config.plan
    greedy = decoding(hw, "beam_lean", 12, beam_size=1)
    assert greedy.beam_size == 1 and tuple(greedy.max_gen_len) == (0.0, 12)


def test_example_verse(script) -> None:
    module = script("predict_600m")
    verse = module.example_verse()
    assert verse and verse in module.SHIPPED.joinpath("tasks/bible_es_en/examples.es").read_text()
