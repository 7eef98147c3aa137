"""Settings a checkpoint stores, read back into their dataclass: a table another tool (or a
newer specbeam) wrote is a one-line error naming what does not fit, not a TypeError."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def stored_settings(kind: type[T], table: Any, what: str) -> T:
    """A `kind` dataclass from the table a checkpoint stores as `what`."""
    names = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    if not isinstance(table, dict):
        raise ValueError(f"its `{what}` is a {type(table).__name__}, not a table")
    unknown = sorted(str(k) for k in table if k not in names)
    if unknown:
        raise ValueError(
            f"its `{what}` has settings specbeam's models do not take: "
            f"{', '.join(unknown)} (they take {', '.join(sorted(names))})"
        )
    return kind(**table)
