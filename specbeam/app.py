"""What every Hydra app of specbeam shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

R = TypeVar("R")


def run_app(app: Callable[[Any], R], cfg: DictConfig) -> R:
    """Runs an app on its structured config; a bad setting or a missing file ends the
    process with one line naming the problem, not a traceback."""
    try:
        return app(OmegaConf.to_object(cfg))
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
