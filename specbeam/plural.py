"""Counts in messages agree with their noun: "1 card", "2 cards"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """`n noun`, the noun in the plural unless n is 1; `plural` for an irregular noun."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
