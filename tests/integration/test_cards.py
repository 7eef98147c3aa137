"""Asset cards: relative paths, the tokenizer fields, and drafts over their target's encoder.
(Loading through fairseq2's hubs by card is tested in test_extension.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from specbeam.integration.cards import SHALLOW_DRAFT_FAMILY, main, model_card
from specbeam.integration.hub import asset_store
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


def test_a_tokenizer_of_a_card_that_does_not_exist_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    """It was written, and the error came only when an app used the card."""
    save_model(build_model(TARGET_ARCH), TARGET_ARCH, tmp_path / "m.pt", torch.float16)
    out = tmp_path / "cards" / "mine.yaml"
    with pytest.raises(SystemExit) as refused:
        main([str(out), f"mine={tmp_path / 'm.pt'}", "--tokenizer-of", "nosuchcard"])
    assert str(refused.value.code) == (
        f"error: --tokenizer-of nosuchcard: no asset card of that name ({out.parent}, "
        "fairseq2's cards, FAIRSEQ2_USER_ASSET_DIR, tasks/*/cards); nothing written"
    )
    assert not out.exists()


def test_cli_names_a_missing_or_unreadable_checkpoint_in_one_line(tmp_path: Path) -> None:
    """Not torch's traceback (nor its advice to load with `weights_only=False`)."""
    out = tmp_path / "cards.yaml"
    not_a_checkpoint = tmp_path / "notes.pt"
    not_a_checkpoint.write_text("hello\n")
    for checkpoint, problem in [
        (tmp_path / "missing.pt", f"{tmp_path}/missing.pt: no such checkpoint file"),
        (not_a_checkpoint, f"{not_a_checkpoint} is not a checkpoint: not a file torch.save wrote"),
    ]:
        cmd = [sys.executable, "-m", "specbeam.cards", str(out), f"x={checkpoint}"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert result.returncode != 0
        assert result.stderr.strip().splitlines() == [f"error: {problem}"]
    assert not out.exists()


def test_a_checkpoint_whose_arch_specbeam_cannot_build_is_named_in_one_line(
    tmp_path: Path,
) -> None:
    """Another tool's (or a newer specbeam's) `arch`: not a TypeError from the dataclass."""
    path = tmp_path / "other.pt"
    torch.save({"arch": {"model_dim": 8, "num_experts": 4, "router": "top2"}, "model": {}}, path)
    with pytest.raises(ValueError) as error:
        model_card("other", path, tmp_path)
    assert str(error.value).startswith(
        f"{path}: its `arch` has settings specbeam's models do not take: num_experts, router "
    )
    torch.save({"arch": [512, 6], "model": {}}, path)
    with pytest.raises(ValueError, match=r"its `arch` is a list, not a table"):
        model_card("other", path, tmp_path)


def test_cards_are_added_to_an_existing_file_and_replaced_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fairseq2's card files hold several documents: a head's card written into the
    target's file joins it, and fairseq2's asset store finds both."""
    for name in ("t", "h", "h_new"):
        save_model(build_model(TARGET_ARCH), TARGET_ARCH, tmp_path / f"{name}.pt", torch.float16)
    cards = tmp_path / "cards"
    out = cards / "my_nllb.yaml"
    spm = str(REPO / "tasks/bible_es_en/spm.model")
    main([str(out), f"my_nllb={tmp_path / 't.pt'}", "--tokenizer", spm])
    main([str(out), f"h2={tmp_path / 'h.pt'}", "--tokenizer-of", "my_nllb"])
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote 1 card to {out}"
    store = asset_store([str(cards)])
    assert store.retrieve_card("my_nllb").field("checkpoint").as_uri().to_path().name == "t.pt"
    assert store.retrieve_card("h2").field("tokenizer_ref").as_(str) == "my_nllb"

    with pytest.raises(SystemExit) as refused:
        main([str(out), f"h2={tmp_path / 'h_new.pt'}"])
    assert str(refused.value.code) == (
        f"error: {out} already has a card named h2: give another name, or pass --replace "
        "to replace it"
    )
    main([str(out), f"h2={tmp_path / 'h_new.pt'}", "--tokenizer-of", "my_nllb", "--replace"])
    assert [c["name"] for c in yaml.safe_load_all(out.read_text())] == ["my_nllb", "h2"]
    store = asset_store([str(cards)])
    assert store.retrieve_card("h2").field("checkpoint").as_uri().to_path().name == "h_new.pt"
