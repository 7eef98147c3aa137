"""Exact speculative beam search for fairseq2 translation models.

The public names load on first use (PEP 562), so that `python -m specbeam.<app>` runs its
start-up (`specbeam/startup.py`) before torch and fairseq2 are imported."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specbeam.integration.models import LoadedPair, ModelPairConfig, open_pair
    from specbeam.search.config import MachineSettings, SearchSettings, SpeculativeSearchConfig
    from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
    from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput

_HOMES = {
    "LoadedPair": "specbeam.integration.models",
    "ModelPairConfig": "specbeam.integration.models",
    "open_pair": "specbeam.integration.models",
    "MachineSettings": "specbeam.search.config",
    "SearchSettings": "specbeam.search.config",
    "SpeculativeSearchConfig": "specbeam.search.config",
    "SpeculativeBeamSearchSeq2SeqGenerator": "specbeam.search.generator",
    "SpecStats": "specbeam.search.stats",
    "SpeculativeGeneratorOutput": "specbeam.search.stats",
}

__all__ = [
    "LoadedPair",
    "ModelPairConfig",
    "open_pair",
    "MachineSettings",
    "SearchSettings",
    "SpecStats",
    "SpeculativeBeamSearchSeq2SeqGenerator",
    "SpeculativeGeneratorOutput",
    "SpeculativeSearchConfig",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'specbeam' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
