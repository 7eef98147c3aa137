"""Counts in the apps' messages agree with their noun."""

from __future__ import annotations

from specbeam.plural import counted


def test_one_is_singular_every_other_count_plural() -> None:
    assert counted(1, "card") == "1 card"
    assert [counted(n, "chunk") for n in (0, 2)] == ["0 chunks", "2 chunks"]
    assert counted(3, "child", "children") == "3 children"
