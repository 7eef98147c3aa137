"""The training app: epochs with dev BLEU, checkpoints, and resuming a stopped run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specbeam.integration.models import ModelArch, build_model, load_model, save_model
from specbeam.training.train import distillation_loss

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "specbeam.train", "arch=draft_small", "arch.model_dim=32",
           "arch.num_attn_heads=2", "arch.ffn_inner_dim=64", "threads=1", "max_tokens=1500",
           "bf16=false", f"task.data_dir={tmp_path}/data", f"out_dir={tmp_path}/out",
           f"hydra.run.dir={tmp_path}/hydra", *overrides]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


def write_task(tmp_path: Path, train: int, dev: int) -> None:
    """A small task from the committed dev split: its first `train` rows, then `dev` rows."""
    rows = (REPO / "tasks/bible_es_en/data/dev.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "data").mkdir()
    (tmp_path / "data/train.tsv").write_text("\n".join(rows[:train]) + "\n", encoding="utf-8")
    dev_rows = rows[train : train + dev]
    (tmp_path / "data/dev.tsv").write_text("\n".join(dev_rows) + "\n", encoding="utf-8")


def test_train_checkpoints_and_resumes(tmp_path) -> None:
    write_task(tmp_path, train=60, dev=6)

    # A 2-step warm-up: with the default 500, a 1-batch epoch barely moves and the loss
    # comparison below would be noise.
    first = run(tmp_path, "max_epochs=2", "warmup_steps=2")
    assert first.returncode == 0, first.stderr
    history = json.loads((tmp_path / "out/history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2]
    assert history[1]["train_loss"] < history[0]["train_loss"]
    model = load_model(tmp_path / "out/best.pt")
    assert model.model_dim == 32

    second = run(tmp_path, "max_epochs=3", "warmup_steps=2")
    assert second.returncode == 0, second.stderr
    # Epochs count from 1, as the progress bar and the history do: the third starts.
    assert "resumed from" in second.stderr and "at epoch 3 batch 0 (step " in second.stderr
    history = json.loads((tmp_path / "out/history.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2, 3]


def test_max_steps_stops_there_and_a_rerun_does_nothing(tmp_path) -> None:
    write_task(tmp_path, train=60, dev=6)
    first = run(tmp_path, "max_steps=1")
    assert first.returncode == 0, first.stderr
    assert "max_steps reached at epoch 1 batch 1 (step 1)" in first.stderr
    again = run(tmp_path, "max_steps=1")
    assert again.returncode == 0, again.stderr
    assert "already at step 1 (max_steps=1): nothing to do" in again.stderr


def test_shallow_draft_trains_over_a_frozen_target_encoder(tmp_path) -> None:
    write_task(tmp_path, train=40, dev=4)
    target_arch = ModelArch(
        model_dim=64, num_encoder_layers=1, num_decoder_layers=1, num_attn_heads=4, ffn_inner_dim=64
    )
    target = build_model(target_arch).eval()
    save_model(target, target_arch, tmp_path / "target.pt", torch.float32)

    result = run(tmp_path, "max_epochs=1", f"shallow_over={tmp_path}/target.pt")
    assert result.returncode == 0, result.stderr
    saved = torch.load(tmp_path / "out/best.pt", weights_only=True)
    assert saved["shares_encoder"] and not any(k.startswith("encoder") for k in saved["model"])
    target = load_model(tmp_path / "target.pt")
    draft = load_model(tmp_path / "out/best.pt", target=target)
    assert draft.encoder is target.encoder and draft.model_dim == 32
    with pytest.raises(ValueError, match="draft decoder over its target's encoder"):
        load_model(tmp_path / "out/best.pt")


def test_distillation_loss_mixes_references_and_teacher() -> None:
    torch.manual_seed(0)
    logits, teacher = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    tgt = torch.tensor([[4, 5, 0], [6, 0, 0]])  # 0 = pad
    mask = tgt != 0
    everything = teacher.log_softmax(-1).sort(-1, descending=True)  # k = V
    top3 = teacher.log_softmax(-1).topk(3, -1)
    lprobs = logits.log_softmax(-1)[mask]

    # k = V: the teacher term is KL(teacher ‖ model) + the teacher's entropy.
    p = teacher.softmax(-1)[mask]
    dense = -(p * lprobs).sum()
    kd = distillation_loss(logits, everything.indices, everything.values, tgt, 0, 0.0, 1.0)
    assert torch.isclose(kd, dense)
    # k = 3: the teacher's three best, renormalised.
    q = top3.values[mask].softmax(-1)
    sparse = -(q * lprobs.gather(-1, top3.indices[mask])).sum()
    assert torch.isclose(
        distillation_loss(logits, top3.indices, top3.values, tgt, 0, 0.0, 1.0), sparse
    )

    ce = torch.nn.functional.cross_entropy(logits[mask], tgt[mask], reduction="sum")
    assert torch.isclose(distillation_loss(logits, top3.indices, top3.values, tgt, 0, 0.0, 0.0), ce)
    half = distillation_loss(logits, top3.indices, top3.values, tgt, 0, 0.0, 0.5)
    assert torch.isclose(half, 0.5 * ce + 0.5 * sparse)


def test_draft_learns_from_a_teacher(tmp_path) -> None:
    """kd_teacher: the draft trains on the teacher's top k as well as the references; the
    top k computed once by `python -m specbeam.teacher` are read, not recomputed."""
    write_task(tmp_path, train=40, dev=4)
    teacher_arch = ModelArch(
        model_dim=32, num_encoder_layers=1, num_decoder_layers=1, num_attn_heads=2, ffn_inner_dim=64
    )
    save_model(
        build_model(teacher_arch).eval(), teacher_arch, tmp_path / "teacher.pt", torch.float32
    )
    cmd = [sys.executable, "-m", "specbeam.teacher", str(tmp_path / "teacher.pt"),
           str(tmp_path / "data/train.tsv"), str(tmp_path / "top.pt"), "--threads", "1"]  # fmt: skip
    computed = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert computed.returncode == 0, computed.stderr
    assert (tmp_path / "top.pt").exists()

    result = run(
        tmp_path, "max_epochs=3", "warmup_steps=2", f"kd_teacher={tmp_path}/teacher.pt",
        "kd_weight=0.7", f"kd_cache={tmp_path}/top.pt",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "teacher top-16 from" in result.stderr
    history = json.loads((tmp_path / "out/history.json").read_text())
    assert history[-1]["train_loss"] < history[0]["train_loss"]
