"""Checkpoint averaging."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from specbeam.integration.models import build_model, load_model, save_model
from specbeam.training.average import average
from tests.conftest import DRAFT_ARCH, TARGET_ARCH

REPO = Path(__file__).resolve().parents[2]


def test_mean_of_a_best_and_a_trainer_checkpoint(tmp_path) -> None:
    torch.manual_seed(0)
    a, b = build_model(TARGET_ARCH), build_model(TARGET_ARCH)
    save_model(a, TARGET_ARCH, tmp_path / "best.pt", torch.float32)
    trainer = {"model": b.state_dict(), "config": {"arch": asdict(TARGET_ARCH)}, "step": 7}
    torch.save(trainer, tmp_path / "last.pt")
    cmd = [sys.executable, "-m", "specbeam.average", str(tmp_path / "avg.pt"),
           str(tmp_path / "best.pt"), str(tmp_path / "last.pt")]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    avg = load_model(tmp_path / "avg.pt").state_dict()
    for key, value in a.state_dict().items():
        torch.testing.assert_close(avg[key], (value + b.state_dict()[key]) / 2)


def test_different_architectures_are_refused(tmp_path) -> None:
    save_model(build_model(TARGET_ARCH), TARGET_ARCH, tmp_path / "t.pt", torch.float32)
    save_model(build_model(DRAFT_ARCH), DRAFT_ARCH, tmp_path / "d.pt", torch.float32)
    with pytest.raises(ValueError, match="has another architecture than"):
        average([tmp_path / "t.pt", tmp_path / "d.pt"])
