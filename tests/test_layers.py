"""Data flows one way: the kernels below the search, the search below fairseq2's
integration, all of them below the data layer (tasks, batches, inference), that below
training, and training below the apps; and no module imports itself back through others,
at module level or inside a function."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specbeam"
HIGHER = ("specbeam.data", "specbeam.training", "specbeam.apps")
BELOW = {"kernels": ("specbeam.search", "specbeam.integration", *HIGHER),
         "search": ("specbeam.integration", *HIGHER),
         "integration": HIGHER,
         "data": HIGHER[1:],
         "training": HIGHER[2:]}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """The project modules `path` imports, anywhere in it: `from a import b` is module
    `a.b` where that is one, else `a`."""
    names: set[str] = set()
    package = module_name(path).rsplit(".", 0 if path.name == "__init__.py" else 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in MODULES else base)
    return {name for name in names if name in MODULES}


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_lower_layer_imports_no_higher_one(package: str) -> None:
    wrong = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in (PACKAGE / package).rglob("*.py")
        for name in imports(path)
        if name.startswith(BELOW[package])
    }
    assert not wrong


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (its modules in order), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_back() -> None:
    """Package `__init__` files are left out: importing `a.b` runs `a/__init__.py` first,
    which is Python's order, not a circle of the project's."""
    inits = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    graph = {
        name: imports(path) - inits - {name} for name, path in MODULES.items() if name not in inits
    }
    assert cycle(graph) is None
