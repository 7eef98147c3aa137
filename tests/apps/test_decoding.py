"""Decodings by name or method string (`specbeam/apps/decoding.py`)."""

from __future__ import annotations

import pytest

from specbeam.apps.decoding import load_decoding


def test_a_method_string_sets_what_it_names() -> None:
    decoding = load_decoding("spec_beam:gamma=6;draft_width=8")
    assert (decoding.gamma, decoding.draft_width, decoding.name) == (
        6, 8, "spec_beam:gamma=6;draft_width=8"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("method", "named"), [("spec_beam:gama=6", "'gama'"), ("spec_beam:gamma=six", "six")]
)
def test_a_misspelt_or_mistyped_setting_is_one_line_naming_it(method: str, named: str) -> None:
    with pytest.raises(ValueError) as error:
        load_decoding(method)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"methods: {method}: ") and named in message


@pytest.mark.parametrize(
    ("method", "unused"),
    [
        ("beam", ["gamma", "plan", "relax_top", "top_k"]),
        ("beam_lean", ["gamma", "plan", "relax_top", "top_k"]),
        ("sample", ["gamma", "lean_target", "plain", "plan", "relax_top"]),
        ("spec_beam", ["top_k"]),
        ("spec_sample", []),
    ],
)
def test_settings_a_decoding_never_reads_are_found(method: str, unused: list[str]) -> None:
    """A speculation setting of a plain decoding, a sampler's of a beam search; a plain beam
    search still reads `plain` and `lean_target`, and every decoding `beam_size`."""
    given = ["gamma", "plan", "relax_top", "top_k", "plain", "lean_target", "beam_size"]
    assert load_decoding(method).unused(given) == sorted(unused)
