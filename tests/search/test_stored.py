"""Settings read back from a checkpoint: what does not fit is named, the rest is kept."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from specbeam.search.stored import stored_settings


@dataclass(kw_only=True)
class _Size:
    width: int = 4
    depth: int = 2


def test_a_stored_table_gives_its_dataclass_with_defaults_for_what_it_lacks() -> None:
    assert stored_settings(_Size, {"width": 8}, "arch") == _Size(width=8, depth=2)


def test_unknown_settings_and_a_table_of_another_kind_are_named() -> None:
    with pytest.raises(ValueError) as error:
        stored_settings(_Size, {"width": 8, "router": "top2", "experts": 4}, "arch")
    assert str(error.value) == (
        "its `arch` has settings specbeam's models do not take: experts, router "
        "(they take depth, width)"
    )
    with pytest.raises(ValueError, match=r"^its `size` is a list, not a table$"):
        stored_settings(_Size, [8, 2], "size")
