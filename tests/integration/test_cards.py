"""Asset cards: relative paths, the tokenizer fields, and drafts over their target's encoder.
(Loading through fairseq2's hubs by card is tested in test_extension.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import yaml

from specbeam.integration.cards import SHALLOW_DRAFT_FAMILY, model_card
from specbeam.integration.models import (
    ModelPairConfig,
    build_model,
    build_shallow_draft,
    save_model,
)
from tests.conftest import DRAFT_ARCH, TARGET_ARCH

REPO = Path(__file__).resolve().parents[2]


def test_cli_writes_cards_with_paths_relative_to_the_card(tmp_path: Path) -> None:
    checkpoint = tmp_path / "models" / "target.pt"
    checkpoint.parent.mkdir()
    save_model(build_model(TARGET_ARCH), TARGET_ARCH, checkpoint, torch.float16)
    out = tmp_path / "cards" / "pair.yaml"
    spm = REPO / "tasks/bible_es_en/spm.model"
    cmd = [sys.executable, "-m", "specbeam.cards", str(out), f"tiny_target={checkpoint}",
           "--tokenizer", str(spm), "--langs", "spa_Latn,eng_Latn"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [card] = list(yaml.safe_load_all(out.read_text()))
    assert card["name"] == "tiny_target" and card["model_family"] == "nllb"
    assert card["checkpoint"] == "../models/target.pt"
    assert (out.parent / card["tokenizer"]).resolve() == spm.resolve()
    assert card["tokenizer_config_overrides"]["langs"] == ["spa_Latn", "eng_Latn"]
    assert card["model_config"]["model_dim"] == TARGET_ARCH.model_dim


def test_a_draft_over_its_target_encoder_gets_specbeams_family(tmp_path: Path) -> None:
    """No fairseq2 family builds a decoder without its encoder: specbeam's extension does."""
    target = build_model(TARGET_ARCH)
    draft = build_shallow_draft(target, DRAFT_ARCH)
    save_model(draft, DRAFT_ARCH, tmp_path / "draft.pt", torch.float16, shares_encoder=True)
    card = model_card("shallow", tmp_path / "draft.pt", tmp_path)
    assert card["model_family"] == SHALLOW_DRAFT_FAMILY == "specbeam_shallow_draft"
    assert card["model_config"]["num_decoder_layers"] == DRAFT_ARCH.num_decoder_layers
    assert card["checkpoint"] == "draft.pt"


def test_cli_refers_a_card_to_another_cards_tokenizer(tmp_path: Path) -> None:
    """`--tokenizer-of` writes fairseq2's `tokenizer_ref`: a head's card takes its
    target's tokenizer, as the apps load it."""
    save_model(build_model(TARGET_ARCH), TARGET_ARCH, tmp_path / "m.pt", torch.float16)
    out = tmp_path / "cards" / "mine.yaml"
    cmd = [sys.executable, "-m", "specbeam.cards", str(out), f"mine={tmp_path / 'm.pt'}",
           "--tokenizer-of", "bible_es_en_target"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [card] = list(yaml.safe_load_all(out.read_text()))
    assert card["tokenizer_ref"] == "bible_es_en_target" and "tokenizer" not in card
    pair = ModelPairConfig(target="mine", asset_dirs=[str(out.parent)])
    assert pair.load_tokenizer().vocab_info.size == 8000
