"""Where the repository is: task files and configs are found relative to it."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def config_file(group: str, name: str) -> Path:
    """`conf/<group>/<name>.yaml`; a ValueError naming the ones there if it is not."""
    path = REPO_ROOT / "conf" / group / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ValueError(f"{group}={name} is unknown; allowed: {known}")
    return path
