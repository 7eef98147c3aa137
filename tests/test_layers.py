"""Data flows one way: the search core below fairseq2's integration, both below the apps."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specbeam"
BELOW = {"search": ("specbeam.apps", "specbeam.integration", "specbeam.training"),
         "integration": ("specbeam.apps", "specbeam.training")}  # fmt: skip


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_lower_layer_imports_no_higher_one(package: str) -> None:
    wrong = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in (PACKAGE / package).rglob("*.py")
        for name in imports(path)
        if name.startswith(BELOW[package])
    }
    assert not wrong
