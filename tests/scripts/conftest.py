"""Scripts are not a package: a test loads one by path."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Loads scripts/<name>.py, registered as module `name` while the test runs
    (dataclasses look their module up), with scripts/ first on the path, as when a
    script runs (scripts import one another's helpers)."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load
