"""scripts/compare_drafts.py on tiny untrained checkpoints over the embedded vocabulary: a
row per draft (a draft decoder and a draft head), the table, JSON and plot written; and
coverage by depth from a pass histogram."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from specbeam.integration.models import ModelArch, build_model, save_head, save_model
from specbeam.search.head import DraftHead, HeadArch
from tests.scripts.conftest import REPO

TARGET = ModelArch(model_dim=64, num_encoder_layers=1, num_decoder_layers=2, num_attn_heads=4,
                   ffn_inner_dim=128, dropout_p=0.0)  # fmt: skip
DRAFT = ModelArch(model_dim=32, num_encoder_layers=1, num_decoder_layers=1, num_attn_heads=2,
                  ffn_inner_dim=64, dropout_p=0.0)  # fmt: skip


def test_coverage_by_depth_counts_passes_that_went_deeper(script) -> None:
    # passes that advanced 1, 2 and 3 beam steps: 4, 3 and 1 of them
    coverage = script("compare_drafts").coverage_by_depth({1: 4, 2: 3, 3: 1}, gamma=3)
    assert coverage == [0.5, 0.125, 0.0]


def test_tiny_checkpoints_give_a_row_each(tmp_path: Path) -> None:
    torch.manual_seed(0)
    target = build_model(TARGET).eval()
    save_model(target, TARGET, tmp_path / "target.pt", torch.float32)
    save_model(build_model(DRAFT).eval(), DRAFT, tmp_path / "draft.pt", torch.float32)
    save_head(DraftHead(target, HeadArch()).eval(), tmp_path / "head.pt", torch.float32)
    cmd = [sys.executable, "scripts/compare_drafts.py", "--target", str(tmp_path / "target.pt"),
           "--threads", "1", "--agreement-sentences", "3", "--bleu-sentences", "2",
           "--tau-sentences", "2", "--gamma", "2", "--draft-width", "5", "--repeats", "1",
           "--out", str(tmp_path / "out"),
           f"decoder={tmp_path / 'draft.pt'}", f"head={tmp_path / 'head.pt'}"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {r["draft"]: r for r in json.loads((tmp_path / "out/drafts.json").read_text())}
    assert set(rows) == {"decoder", "head"}
    assert rows["decoder"]["greedy_dev_bleu"] is not None and not rows["decoder"]["shares_encoder"]
    assert rows["head"]["greedy_dev_bleu"] is None  # a head does not translate alone
    for row in rows.values():
        assert row["tau"] >= 1 and len(row["coverage_by_depth"]) == 2
        assert 0 <= row["top1_agreement"] <= 1 and row["agreement_positions"] > 0
        assert row["draft_step_ms"] > 0 and row["target_step_ms"] > 0
    table = (tmp_path / "out/drafts.md").read_text()
    assert "| decoder | " in table and "| head | " in table and "| — |" in table
    assert (tmp_path / "out/drafts.png").stat().st_size > 0
