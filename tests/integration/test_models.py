"""Model building, checkpoints, pairs."""

from __future__ import annotations

import copy

import pytest
import torch

from specbeam.integration.models import (
    HeadTargetMismatch,
    ModelArch,
    ModelPairConfig,
    build_model,
    build_shallow_draft,
    cast_draft,
    check_same_pieces,
    check_same_vocabulary,
    is_target_itself,
    load_model,
    load_pair,
    load_target,
    num_parameters,
    same_target,
    save_head,
    save_model,
    target_fingerprint,
)
from specbeam.paths import SHIPPED
from specbeam.search.head import DraftHead, HeadArch
from tests.conftest import DRAFT_ARCH, TARGET_ARCH


def test_checkpoint_round_trip(tmp_path) -> None:
    model = build_model(TARGET_ARCH).eval()
    save_model(model, TARGET_ARCH, tmp_path / "m.pt", torch.float32)
    loaded = load_model(tmp_path / "m.pt")
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_fairseq2_checkpoint_given_as_a_path_points_to_asset_cards(tmp_path) -> None:
    """fairseq2's own checkpoints hold no `arch`: the family and settings come from a
    card, so a path is refused in one line naming the file and the way that works."""
    path = tmp_path / "their_model.pt"
    torch.save({"model": {"encoder.layers.0.weight": torch.zeros(2)}}, path)
    with pytest.raises(ValueError) as error:
        load_target(str(path))
    assert str(error.value).startswith(
        f"model.target={path}: {path} is not a specbeam checkpoint (no `arch`): "
    )
    assert "model.target=NAME" in str(error.value) and "\n" not in str(error.value)


def test_a_file_that_is_no_checkpoint_is_one_line_naming_the_setting(tmp_path) -> None:
    """torch's own error for it is a traceback advising weights_only=False, unsafe here."""
    path = tmp_path / "notes.pt"
    path.write_bytes(b"not a model\n\x80\x03")
    with pytest.raises(ValueError) as error:
        load_target(str(path))
    assert str(error.value) == (
        f"model.target={path}: {path} is not a checkpoint: not a file torch.save wrote"
    )


def test_a_missing_checkpoint_hints_at_the_embedded_pair_only_for_its_files(tmp_path) -> None:
    """A user's own path is named alone: how to build the embedded pair is no help there."""
    mine = tmp_path / "best.pt"
    with pytest.raises(FileNotFoundError) as error:
        load_target(str(mine))
    assert str(error.value) == f"model.target={mine}: checkpoint not found: {mine}"
    embedded = SHIPPED / "tasks" / "bible_es_en" / "models" / "nowhere.pt"
    with pytest.raises(FileNotFoundError, match=r"README.md says how to build the embedded pair"):
        load_target(str(embedded))


def test_a_truncated_checkpoint_is_named_truncated(tmp_path) -> None:
    """A copy cut short, not a matter of reading safely; and a file of pickled objects is
    named as what specbeam will not unpickle."""
    path = tmp_path / "target.pt"
    save_model(build_model(TARGET_ARCH), TARGET_ARCH, path, torch.float32)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError) as error:
        load_target(str(path))
    assert str(error.value) == (
        f"model.target={path}: {path} is truncated or corrupt: torch cannot read its archive; "
        "copy or save it again"
    )
    torch.save({"arch": object()}, path)
    with pytest.raises(ValueError, match=r"target.pt holds Python objects beside its tensors"):
        load_target(str(path))


def test_shallow_draft_shares_the_target_encoder(tiny_target) -> None:
    target = copy.deepcopy(tiny_target)
    draft = build_shallow_draft(target, DRAFT_ARCH)
    assert draft.encoder is target.encoder and draft.encoder_frontend is target.encoder_frontend
    own = (
        num_parameters(draft)
        - num_parameters(target.encoder)
        - num_parameters(target.encoder_frontend)
    )
    assert own < num_parameters(build_model(DRAFT_ARCH))  # no encoder weights of its own
    check_same_vocabulary(target, draft)
    cast_draft(draft, target, torch.bfloat16)
    assert next(draft.decoder.parameters()).dtype == torch.bfloat16
    assert next(target.encoder.parameters()).dtype == torch.float32  # verification stays fp32


def test_a_pair_loads_a_shallow_draft_over_its_target(tmp_path, tiny_target) -> None:
    """The draft checkpoint has no encoder: the pair rebuilds it over the loaded target's."""
    target = copy.deepcopy(tiny_target)
    save_model(target, TARGET_ARCH, tmp_path / "target.pt", torch.float32)
    save_model(
        build_shallow_draft(target, DRAFT_ARCH), DRAFT_ARCH, tmp_path / "draft.pt",
        torch.float32, shares_encoder=True,
    )  # fmt: skip
    pair = ModelPairConfig(target=str(tmp_path / "target.pt"), draft=str(tmp_path / "draft.pt"))
    loaded, draft = load_pair(pair, TARGET_ARCH.vocab_size, with_draft=True)
    assert draft is not None and draft.encoder is loaded.encoder


def test_a_draft_that_is_the_target_itself_is_a_warning(tmp_path, tiny_target, caplog) -> None:
    """Named by another path (a link): it runs (the output is the same), but every draft call costs
    a target call; a real draft passes without a word."""
    target = copy.deepcopy(tiny_target)
    save_model(target, TARGET_ARCH, tmp_path / "target.pt", torch.float32)
    (tmp_path / "same.pt").symlink_to(tmp_path / "target.pt")
    itself = str(tmp_path / "same.pt")
    pair = ModelPairConfig(target=str(tmp_path / "target.pt"), draft=itself)
    with caplog.at_level("WARNING", logger="specbeam.models"):
        load_pair(pair, TARGET_ARCH.vocab_size, with_draft=True)
    assert [r.getMessage() for r in caplog.records] == [
        f"model.draft={itself} is model.target={tmp_path}/target.pt itself: each draft call "
        "costs a target call, so speculation runs slower than plain search; name a smaller "
        "draft, or use a non-speculative decoding (beam, greedy)"
    ]
    assert not is_target_itself(build_shallow_draft(target, DRAFT_ARCH), target)
    assert not is_target_itself(DraftHead(target, HeadArch()), target)


def test_mismatched_vocabulary_is_refused(tiny_target) -> None:
    other = build_model(ModelArch(**{**DRAFT_ARCH.__dict__, "vocab_size": 50}))
    with pytest.raises(
        ValueError,
        match=r"draft vocabulary \(50 entries\) differs from the target's \(48 entries\)",
    ):
        check_same_vocabulary(tiny_target, other)


def test_tokenizers_with_different_pieces_are_refused(tmp_path) -> None:
    """Same size and special indices, two pieces swapped: the pieces check finds it."""
    from fairseq2.models.nllb import NllbTokenizerConfig, load_nllb_tokenizer
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((SHIPPED / "tasks/bible_es_en/spm.model").read_bytes())
    a, b = proto.pieces[100].piece, proto.pieces[101].piece
    proto.pieces[100].piece, proto.pieces[101].piece = b, a
    (tmp_path / "swapped.model").write_bytes(proto.SerializeToString())
    config = NllbTokenizerConfig(langs=["spa_Latn", "eng_Latn"], default_lang="eng_Latn")
    swapped = load_nllb_tokenizer(tmp_path / "swapped.model", config)
    ours = ModelPairConfig().load_tokenizer()
    assert swapped.vocab_info == ours.vocab_info
    check_same_pieces(ours, ModelPairConfig().load_tokenizer())
    first = min(ours._model.token_to_index(a), ours._model.token_to_index(b))
    want_ours, want_theirs = (a, b) if ours._model.token_to_index(a) == first else (b, a)
    message = (
        f"draft tokenizer piece {first} is {want_theirs!r} where the target's is {want_ours!r}"
    )
    with pytest.raises(ValueError, match=message):
        check_same_pieces(ours, swapped)


def test_tied_weights_are_stored_once(tmp_path) -> None:
    model = build_model(TARGET_ARCH)
    save_model(model, TARGET_ARCH, tmp_path / "m.pt", torch.float16)
    saved = torch.load(tmp_path / "m.pt", weights_only=True)["model"]
    groups: dict[int, list[str]] = {}
    for key, value in model.state_dict().items():
        groups.setdefault(value.data_ptr(), []).append(key)
    tied = [keys for keys in groups.values() if len(keys) > 1]
    assert tied, "the NLLB architecture ties its embeddings and output projection"
    for keys in tied:
        assert len({saved[k].data_ptr() for k in keys}) == 1, keys


def test_a_head_stores_its_targets_fingerprint(tmp_path, tiny_target) -> None:
    """A head loads over its own target (also cast to bf16), never over another, and a
    head saved before fingerprints still loads."""
    target = copy.deepcopy(tiny_target)
    save_head(DraftHead(target, HeadArch(num_layers=1)), tmp_path / "head.pt", torch.float32)
    assert same_target(torch.load(tmp_path / "head.pt")["target"], target_fingerprint(target))
    assert isinstance(load_model(tmp_path / "head.pt", target=target), DraftHead)
    assert isinstance(
        load_model(tmp_path / "head.pt", target=copy.deepcopy(target).to(torch.bfloat16)), DraftHead
    )
    torch.manual_seed(9)
    other = build_model(TARGET_ARCH)
    with pytest.raises(
        HeadTargetMismatch,
        match=r"head.pt stores target fingerprint \w{12}, this target's is \w{12}",
    ):
        load_model(tmp_path / "head.pt", target=other)
    ckpt = torch.load(tmp_path / "head.pt")
    del ckpt["target"]
    torch.save(ckpt, tmp_path / "old.pt")
    assert isinstance(load_model(tmp_path / "old.pt", target=other), DraftHead)


def test_the_shipped_head_stores_the_shipped_targets_fingerprint() -> None:
    """The embedded pair is checked like any other: its head refuses another target."""
    models = SHIPPED / "tasks/bible_es_en/models"
    stored = torch.load(models / "head.pt", map_location="cpu", weights_only=False)["target"]
    assert same_target(stored, target_fingerprint(load_model(models / "target.pt")))
