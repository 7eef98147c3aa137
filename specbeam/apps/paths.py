"""Where the repository is: task files and configs are found relative to it."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
