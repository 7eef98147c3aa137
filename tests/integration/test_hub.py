"""Models by asset card or path in the apps: tiny random models of fairseq2's `nllb`
family and of the `transformer` family behind temporary cards (in `model.asset_dirs`, or
`FAIRSEQ2_USER_ASSET_DIR`), the tokenizer from the target's card, and one-line errors
for what does not fit."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import specbeam.apps.translate  # noqa: F401  (registers translate_schema)
from specbeam.apps.app import run_app
from specbeam.data.inference import translate_texts
from specbeam.integration.cards import model_card, tokenizer_fields, write_cards
from specbeam.integration.hub import asset_store, load_card_model, retrieve_card
from specbeam.integration.models import ModelArch, build_model, save_head, save_model
from specbeam.integration.transformer import TransformerConfig, create_transformer_model
from specbeam.paths import SHIPPED
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead, HeadArch
from tests.conftest import DRAFT_ARCH, TARGET_ARCH

SPM = SHIPPED / "tasks/bible_es_en/spm.model"
LANGS = ["spa_Latn", "eng_Latn"]
SIZE = 8000  # the embedded tokenizer's vocabulary: the tiny models' here
TEXTS = ["En el principio crió Dios los cielos y la tierra.", "Y dijo Dios: Sea la luz."]


def _tiny_transformer(seed: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = _transformer_config(layers)
    return create_transformer_model(config).eval()


def _transformer_config(layers: int) -> TransformerConfig:
    return TransformerConfig(
        model_dim=64, max_seq_len=128, vocab_size=SIZE, num_encoder_layers=1,
        num_decoder_layers=layers, num_encoder_attn_heads=4, num_decoder_attn_heads=4,
        ffn_inner_dim=128, dropout_p=0.0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One card directory: NLLB-family and transformer-family targets and drafts over the
    embedded tokenizer, a head over the NLLB target, and the misfits."""
    root = tmp_path_factory.mktemp("assets")
    card_dir, models = root / "cards", root / "models"
    models.mkdir()
    tokenizer = tokenizer_fields(SPM, card_dir, LANGS, "eng_Latn")
    entries = []

    def nllb(name: str, arch: ModelArch, seed: int, with_tokenizer: bool = True) -> None:
        torch.manual_seed(seed)
        model = build_model(arch).eval()
        save_model(model, arch, models / f"{name}.pt", torch.float32)
        card = model_card(name, models / f"{name}.pt", card_dir)
        entries.append({**card, **(tokenizer if with_tokenizer else {})})

    target_arch = dataclasses.replace(TARGET_ARCH, vocab_size=SIZE)
    nllb("tiny_nllb", target_arch, seed=0)
    nllb("tiny_nllb_draft", dataclasses.replace(DRAFT_ARCH, vocab_size=SIZE), seed=1)
    nllb("tiny_nllb_other", target_arch, seed=5)
    nllb("tiny_nllb_untokenized", target_arch, seed=0, with_tokenizer=False)
    legacy = models / "tiny_nllb_legacy.pt"  # tiny_nllb's, in the format torch cannot map
    torch.save(torch.load(models / "tiny_nllb.pt"), legacy, _use_new_zipfile_serialization=False)
    entries.append({**model_card("tiny_nllb_legacy", legacy, card_dir), **tokenizer})
    nllb("small_vocab_draft", DRAFT_ARCH, seed=2, with_tokenizer=False)  # 48 entries
    for name, seed, layers in (("tiny_transformer", 3, 2), ("tiny_transformer_draft", 4, 1)):
        torch.save({"model": _tiny_transformer(seed, layers).state_dict()}, models / f"{name}.pt")
        config = dataclasses.asdict(_transformer_config(layers))
        entries.append({
            "name": name, "model_family": "transformer", "model_config": config,
            "checkpoint": f"../models/{name}.pt", **tokenizer,
        })  # fmt: skip
    bad_config = {**dataclasses.asdict(_transformer_config(2)), "vocab_size": SIZE - 2}
    entries.append({
        "name": "tiny_transformer_badvocab", "model_family": "transformer",
        "model_config": bad_config, "checkpoint": "../models/tiny_transformer.pt", **tokenizer,
    })  # fmt: skip
    torch.manual_seed(6)
    target = build_model(target_arch)
    torch.manual_seed(0)
    target.load_state_dict(build_model(target_arch).state_dict())  # tiny_nllb's weights
    save_head(DraftHead(target, HeadArch(num_layers=1)), models / "head.pt", torch.float32)
    head_card = model_card("tiny_nllb_head", models / "head.pt", card_dir)
    entries.append({**head_card, "tokenizer_ref": "tiny_nllb"})  # its pieces are checked
    entries.append({"name": "no_checkpoint", "model_family": "nllb", **tokenizer})
    # fairseq2 resolves an inherited relative path against the leaf card: give the files.
    shipped = {
        "checkpoint": str(SHIPPED / "tasks/bible_es_en/models/target.pt"),
        "tokenizer": str(SPM),
    }
    entries.append({"name": "shipped_target_again", "base": "bible_es_en_target", **shipped})
    write_cards(card_dir / "tiny.yaml", entries)
    return card_dir


def _build(cards: Path, *overrides: str) -> tuple:
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose(
            "translate",
            overrides=["hardware.threads=1", f"model.asset_dirs=[{cards}]", *overrides],
        )
    return run_app(lambda c: c.build(), cfg)


def _error(cards: Path, *overrides: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _build(cards, *overrides)
    message = str(exit_info.value.code)
    assert "\n" not in message and message.startswith("error: ")
    return message


@pytest.mark.parametrize(
    ("target", "draft"),
    [("tiny_nllb", "tiny_nllb_draft"), ("tiny_transformer", "tiny_transformer_draft"),
     ("tiny_nllb", "tiny_nllb_head")],
)  # fmt: skip
def test_a_pair_by_card_translates_as_beam_search(cards: Path, target: str, draft: str) -> None:
    """Both families load through fairseq2's hub by card name; the tokenizer is the
    target card's; speculation gives beam search's output."""
    pair = [f"model.target={target}", f"model.draft={draft}", "decoding.max_gen_len=[0.5,6]"]
    tokenizer, beam = _build(cards, *pair, "decoding=beam")
    _, spec = _build(cards, *pair, "decoding=spec_beam", "decoding.plan=false")
    assert isinstance(spec, SpeculativeBeamSearchSeq2SeqGenerator)
    assert tokenizer.vocab_info.size == SIZE
    want = translate_texts(beam, tokenizer, TEXTS, "spa_Latn", "eng_Latn")
    assert translate_texts(spec, tokenizer, TEXTS, "spa_Latn", "eng_Latn") == want


def test_a_checkpoint_torch_cannot_map_loads_as_the_same_model(cards: Path) -> None:
    store = asset_store([str(cards)])
    mapped, legacy = (
        load_card_model(retrieve_card(store, "model.target", name), "model.target", torch.float32)
        for name in ("tiny_nllb", "tiny_nllb_legacy")
    )
    want = torch.load(cards.parent / "models/tiny_nllb.pt")["model"]
    for model in (mapped, legacy):
        state = model.state_dict()
        assert state.keys() == want.keys()
        assert all(torch.equal(state[k], want[k]) for k in want)


def test_draft_none_runs_plain_decodings(cards: Path) -> None:
    _, generator = _build(
        cards, "model.target=tiny_transformer", "model.draft=none", "decoding=beam"
    )
    assert not isinstance(generator, SpeculativeBeamSearchSeq2SeqGenerator)
    message = _error(cards, "model.target=tiny_nllb", "model.draft=none")
    assert "decoding=spec_beam is speculative but model.draft is none" in message


def test_a_card_in_asset_dirs_may_name_a_base_card_elsewhere(cards: Path) -> None:
    """The store is fairseq2's, built over every source: the base is a shipped card."""
    tokenizer, generator = _build(
        cards, "model.target=shipped_target_again", "model.draft=none", "decoding=beam"
    )
    assert tokenizer.vocab_info.size == SIZE and generator.model.model_dim == 512


def test_checkpoint_paths_and_a_tokenizer_card(cards: Path) -> None:
    models = cards.parent / "models"
    _, generator = _build(
        cards, f"model.target={models / 'tiny_nllb.pt'}", f"model.draft={models / 'head.pt'}",
        "model.tokenizer=tiny_nllb", "decoding.plan=false",
    )  # fmt: skip
    assert isinstance(generator._draft_model, DraftHead)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.target=nope"], "model.target=nope: no asset card of that name"),
        (["model.target=no_checkpoint"], "model.target=no_checkpoint (card path:"),
        (["model.target=no_checkpoint"], "/cards) names no checkpoint"),
        (
            ["model.target=tiny_nllb_untokenized"],
            "model.target=tiny_nllb_untokenized (card path:",
        ),
        (["model.target=tiny_nllb_untokenized"], "names no tokenizer: set model.tokenizer"),
        (
            ["model.target=tiny_nllb", "task.src_lang=fra_Latn"],
            "task.src_lang=fra_Latn is not a language of the tokenizer of card tiny_nllb: "
            "allowed: eng_Latn, spa_Latn",
        ),
        (
            ["model.target=tiny_nllb", "model.draft=small_vocab_draft"],
            "model.draft=small_vocab_draft does not fit model.target=tiny_nllb: draft "
            "vocabulary (48 entries) differs from the target's (8000 entries)",
        ),
        (
            ["model.target=tiny_nllb_other", "model.draft=tiny_nllb_head"],
            "model.draft=tiny_nllb_head does not fit model.target=tiny_nllb_other: a draft "
            "head made for another target (",
        ),
        (
            ["model.target=tiny_transformer", "model.draft=bible_es_en_head"],  # no fingerprint
            "model.draft=bible_es_en_head does not fit model.target=tiny_transformer: a draft "
            "head made for another target (",
        ),
        (
            ["model.target=/nowhere/target.pt", "model.tokenizer=tiny_nllb"],
            "model.target=/nowhere/target.pt: checkpoint not found",
        ),
        (
            ["model.target=tiny_transformer_badvocab"],  # fairseq2's reason, not only its verdict
            "asset card is erroneous: `encoder_frontend.embed.weight` has a shape of "
            f"({SIZE}, 64) in the checkpoint, but has a shape of ({SIZE - 2}, 64) in the model …",
        ),
        (
            ["model.target=/nowhere/target.pt"],  # a missing file first: it is the problem
            "model.target=/nowhere/target.pt: checkpoint not found",
        ),
        (
            [f"model.target={SHIPPED}/tasks/bible_es_en/models/target.pt"],
            "models/target.pt is not an asset card, so it names no tokenizer",
        ),
    ],
)
def test_mismatches_are_one_line(cards: Path, overrides: list[str], expected: str) -> None:
    assert expected in _error(cards, *overrides)


def test_a_card_name_that_is_a_file_here_says_how_to_give_a_path(
    cards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mymodel").mkdir()
    assert _error(cards, "model.target=mymodel").endswith(
        "; ./mymodel exists, but a checkpoint path needs a / or .pt to be read as one"
    )


def test_a_head_of_another_target_says_what_to_do_instead(cards: Path) -> None:
    """The default draft is the embedded pair's head: a user's own target meets this first."""
    message = _error(cards, "model.target=tiny_nllb_other", "model.draft=tiny_nllb_head")
    assert message.endswith(
        '; model.draft=none decodes without one, or train one for it (README, "Your own model")'
    )


def test_asset_dirs_that_do_not_exist_are_named(tmp_path: Path) -> None:
    message = _error(tmp_path / "missing", "model=tiny_random")
    assert f"model.asset_dirs: {tmp_path / 'missing'} does not exist" in message


def test_head_fingerprint_survives_a_cast(cards: Path) -> None:
    """A bf16 target is the same target: its head still loads."""
    _, generator = _build(
        cards, "model.target=tiny_nllb", "model.draft=tiny_nllb_head", "decoding.plan=false",
        "hardware.draft_dtype=bfloat16",
    )  # fmt: skip
    assert isinstance(generator._draft_model, DraftHead)


def test_user_asset_dir_cards_in_a_command(cards: Path, tmp_path: Path) -> None:
    """FAIRSEQ2_USER_ASSET_DIR is fairseq2's own: `translate` finds the cards there."""
    env = {**os.environ, "FAIRSEQ2_USER_ASSET_DIR": str(cards)}
    cmd = [sys.executable, "-m", "specbeam.translate", "model.target=tiny_transformer",
           "model.draft=none", "decoding=greedy", "decoding.max_gen_len=[0.5,4]",
           "hardware.threads=1", f"hydra.run.dir={tmp_path}"]  # fmt: skip
    result = subprocess.run(
        cmd, input=TEXTS[0] + "\n", cwd=SHIPPED, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
