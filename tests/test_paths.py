"""Paths a user gives are the working directory's; a shipped config's are the package's."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from specbeam.data.task import TaskConfig
from specbeam.paths import SHIPPED, user_path


def test_user_paths_resolve_against_the_working_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert user_path("models/target.pt") == tmp_path / "models/target.pt"
    assert user_path("/abs/x.pt") == Path("/abs/x.pt")
    assert user_path("~/x.pt") == Path.home() / "x.pt"


def test_shipped_marker_resolves_to_the_shipped_files_from_anywhere(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({"checkpoint": "${specbeam:tasks/bible_es_en/models/target.pt}"})
    assert Path(cfg.checkpoint) == SHIPPED / "tasks/bible_es_en/models/target.pt"
    assert Path(cfg.checkpoint).is_file()
    assert len(TaskConfig().split("dev")) > 0  # the default task's data, not ./tasks/...
