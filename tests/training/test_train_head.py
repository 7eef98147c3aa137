"""The head's training forward is its drafting forward, and training raises acceptance."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
import yaml

from specbeam.data.batches import pad
from specbeam.data.tokens import TokenizedPair
from specbeam.integration.cards import model_card, tokenizer_fields, write_cards
from specbeam.integration.models import (
    ModelArch,
    TargetConfig,
    build_model,
    save_head,
    save_model,
)
from specbeam.integration.transformer import TransformerConfig, create_transformer_model
from specbeam.paths import SHIPPED
from specbeam.search.head import DraftHead, HeadArch
from specbeam.search.slots import SlotTable
from specbeam.search.tree_attention import TreeDecoder
from specbeam.training.head_data import HeadData, compute_head_data
from specbeam.training.train_head import (
    HeadTrainer,
    TrainHeadConfig,
    head_loss,
    head_score,
    init_head,
    unrolled_states,
)
from tests.conftest import synthetic_pair, train_head_briefly


@pytest.fixture(scope="module")
def data(tiny_target) -> HeadData:
    gen = torch.Generator().manual_seed(5)
    pairs = [TokenizedPair(*synthetic_pair(gen)) for _ in range(160)]
    return compute_head_data(tiny_target, pairs, 0, 8, prompt_len=1, bf16=False)


@pytest.fixture(scope="module")
def fused_data(tiny_target) -> HeadData:
    """The same pairs with the target's first layer's output beside its final state."""
    gen = torch.Generator().manual_seed(5)
    pairs = [TokenizedPair(*synthetic_pair(gen)) for _ in range(160)]
    return compute_head_data(
        tiny_target, pairs, 0, 8, prompt_len=1, bf16=False, feature_layers=(0,)
    )


def test_data_over_several_layers_holds_what_verification_taps(
    tiny_target, data, fused_data
) -> None:
    """The stored layer outputs are the ones a verification pass hands a head (the
    target's decoder with `taps`), and the final states are the plain data's."""
    assert fused_data.states.shape == (len(data.tokens), 128)
    assert torch.equal(fused_data.select(()).states, data.states)
    assert fused_data.select(()).feature_layers == ()
    with pytest.raises(
        ValueError, match="distinct layers 0 to 0 of the target's decoder, ascending"
    ):
        compute_head_data(tiny_target, [], 0, 8, prompt_len=1, feature_layers=(1, 0))
    batch = fused_data.batch([7], 0)
    length = batch.lens[0]
    src, layout = pad([torch.zeros(batch.encoder.size(1), dtype=torch.int64)], 0)
    for lean in (True, False):
        dec = TreeDecoder(
            tiny_target, src, layout, hyps_per_source=1, capacity=2 * length,
            encoder_output=batch.encoder, lean=lean, taps=(0,),
        )  # fmt: skip
        table = SlotTable(1, length, torch.device("cpu"))
        tokens = batch.tokens[:, None, :length]
        table.add_chains(tokens, torch.tensor([length]), torch.zeros(1, dtype=torch.int64))
        with torch.no_grad():
            features = dec.features(dec.forward(*table.query(0, length)))
        # Stored in fp16: half an ulp is 2^-12 relative.
        torch.testing.assert_close(features, batch.states[:, :length], atol=2e-3, rtol=1e-3)


def test_data_holds_the_targets_states_and_distributions(tiny_target, data) -> None:
    batch = data.batch([3], 0)
    length = batch.lens[0]
    src = data.encoder[data.src_offsets[3] : data.src_offsets[4]]
    assert batch.encoder.shape[1] == len(src)
    logits = tiny_target.final_proj(batch.states[0, :length])
    top = torch.log_softmax(logits, -1).topk(8, -1)
    assert torch.equal(top.indices, batch.top_idx[0, :length])
    # Stored in fp16 (states and log-probs): half an fp16 ulp is 2^-12 relative ≈ 2.4e-4.
    torch.testing.assert_close(top.values, batch.top_logp[0, :length], atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize(("lean", "fused"), [(True, False), (False, False), (True, True)])
def test_training_steps_match_the_drafting_decoder(
    tiny_target, untrained_head, fused_head, data, fused_data, lean, fused
):
    """Step 0 reads the target's states along the prefix (fused, for a head over several
    layers), step 1 the head's own state of the parent: the tree decoder, fed as the
    drafter feeds it, gives the same states."""
    head: DraftHead = fused_head if fused else untrained_head
    data = fused_data if fused else data
    row = 7
    batch = data.batch([row], 0)
    length = batch.lens[0]
    with torch.no_grad():
        step0, step1 = unrolled_states(head, batch, 2)
        # The encoder output is given; the source only sizes the batch.
        src, layout = pad([torch.zeros(batch.encoder.size(1), dtype=torch.int64)], 0)
        dec = TreeDecoder(
            head, src, layout, hyps_per_source=1, capacity=4 * length,
            encoder_output=batch.encoder, lean=lean,
        )  # fmt: skip
        table = SlotTable(1, 2 * length, torch.device("cpu"))
        tokens = batch.tokens[:, None, :length]
        roots = table.add_chains(tokens, torch.tensor([length]), torch.zeros(1, dtype=torch.int64))
        parents = head.fuse_features(
            torch.cat([torch.zeros_like(batch.states[:, :1]), batch.states[:, : length - 1]], 1)
        )
        chain = dec.forward(*table.query(0, length), features=parents)
        torch.testing.assert_close(chain, step0[:, :length], atol=1e-5, rtol=1e-4)
        # Position t + 1's token as a drafted child of slot t, reading slot t's state.
        slots = roots[:, :1] - length + 1 + torch.arange(length - 1)
        table.add_nodes(
            batch.tokens[:, 1:length], slots, torch.ones(1, length - 1, dtype=torch.bool)
        )
        children = dec.forward(*table.query(length, table.size), features=chain[:, : length - 1])
        torch.testing.assert_close(children, step1[:, 1:length], atol=1e-5, rtol=1e-4)


def test_a_head_over_several_layers_starts_where_its_init_stood(
    tmp_path, tiny_target, untrained_head, data, fused_data
) -> None:
    """`init=` a last-layer head with `feature_layers`: the same weights and a fusion
    that picks the final state, so training starts from the init's predictions."""
    save_head(untrained_head, tmp_path / "head.pt", torch.float32)
    wider = init_head(tmp_path / "head.pt", tiny_target, (0,))
    assert wider.feature_layers == (0,)
    with torch.no_grad():
        for want, got in zip(
            unrolled_states(untrained_head, data.batch([3, 9], 0), 2),
            unrolled_states(wider, fused_data.batch([3, 9], 0), 2),
            strict=True,
        ):
            torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="only a head over the final state alone"):
        save_head(wider, tmp_path / "wider.pt", torch.float32)
        init_head(tmp_path / "wider.pt", tiny_target, ())


def test_training_lowers_the_loss_and_raises_agreement(tiny_target, data) -> None:
    torch.manual_seed(0)
    head = DraftHead(tiny_target, HeadArch(num_layers=1))
    held_out = data.batch(list(range(128, 160)), 0)
    _, before = head_loss(head, held_out, 2, 0.5)
    train_head_briefly(head, data, 128, 60, 2)
    _, after = head_loss(head, held_out, 2, 0.5)
    for b, a in zip(before, after, strict=True):
        assert a.summary()["loss"] < b.summary()["loss"]
        assert a.summary()["top1"] > b.summary()["top1"] + 0.2


def test_a_target_the_lean_decoder_cannot_run_is_refused_by_card(tmp_path) -> None:
    """A post-norm `transformer` target, by card: one line naming the target and why."""
    config = TransformerConfig(
        model_dim=32, vocab_size=8000, num_encoder_layers=1, num_decoder_layers=1,
        num_encoder_attn_heads=2, num_decoder_attn_heads=2, ffn_inner_dim=64,
    )  # fmt: skip
    torch.save({"model": create_transformer_model(config).state_dict()}, tmp_path / "t.pt")
    spm = SHIPPED / "tasks/bible_es_en/spm.model"
    card = {"name": "post_norm", "model_family": "transformer",
            "model_config": dataclasses.asdict(config), "checkpoint": "t.pt",
            **tokenizer_fields(spm, tmp_path, ["spa_Latn", "eng_Latn"], "eng_Latn")}  # fmt: skip
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(card))
    (tmp_path / "data.tsv").write_text("a\tHola\tHello\n")
    cfg = TrainHeadConfig(
        model=TargetConfig(target="post_norm", asset_dirs=[str(tmp_path)]),
        data=str(tmp_path / "data.tsv"), data_cache=str(tmp_path / "states.pt"),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^model.target=post_norm: a draft head trains on the lean decoder, which cannot run this target's \(norm order POST\): a head needs pre-norm layers, as NLLB's are$"):  # fmt: skip
        HeadTrainer(cfg)


def small_target_config(tmp_path: Path, pairs: int, **settings: object) -> TrainHeadConfig:
    """A tiny target behind a card, `pairs` pairs of data, and train_head's config for them."""
    arch = ModelArch(
        model_dim=32, num_encoder_layers=1, num_decoder_layers=1, num_attn_heads=2,
        ffn_inner_dim=64, dropout_p=0.0, vocab_size=8000, max_seq_len=64,
    )  # fmt: skip
    save_model(build_model(arch), arch, tmp_path / "t.pt", torch.float32)
    spm = SHIPPED / "tasks/bible_es_en/spm.model"
    card = {**model_card("small", tmp_path / "t.pt", tmp_path),
            **tokenizer_fields(spm, tmp_path, ["spa_Latn", "eng_Latn"], "eng_Latn")}  # fmt: skip
    write_cards(tmp_path / "card.yaml", [card])
    rows = [f"r{i}\tHola {i}\tHello {i}\n" for i in range(pairs)]
    (tmp_path / "data.tsv").write_text("".join(rows))
    return TrainHeadConfig(
        model=TargetConfig(target="small", asset_dirs=[str(tmp_path)]), threads=1, bf16=False,
        data=str(tmp_path / "data.tsv"), data_cache=str(tmp_path / "states.pt"),
        out_dir=str(tmp_path / "head"), **settings,
    )  # fmt: skip


def test_too_few_pairs_to_hold_one_out_is_one_error(tmp_path) -> None:
    cfg = small_target_config(tmp_path, pairs=1)
    with pytest.raises(ValueError, match=r"^.*data.tsv has 1 pair: a head needs at least 2, one to train on and one to hold out$"):  # fmt: skip
        HeadTrainer(cfg)
    assert not (tmp_path / "states.pt").exists()  # refused before the target's pass


def test_a_small_corpus_holds_out_a_tenth_and_the_logs_count_epochs_alike(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """The default `valid_pairs` on 30 pairs holds out 3; a run stopped by its budget
    and its resumption name the same epoch and batch (1-based epochs, as the progress
    bar), and each run ends naming its best checkpoint."""
    cfg = small_target_config(tmp_path, pairs=30, max_tokens=40, time_budget_minutes=1e-9)
    caplog.set_level(logging.INFO, logger="specbeam.train_head")
    trainer = HeadTrainer(cfg)
    assert (len(trainer.valid_rows), len(trainer.train_rows)) == (3, 27)
    trainer.run()
    best = f"best head: {tmp_path}/head/best.pt (step 1; held out, the target's top 5"
    messages = caplog.messages
    assert "holding out 3 pairs of 30 for validation (valid_pairs=500: at most a tenth)" in messages
    assert "time budget reached at epoch 1 batch 1 (step 1)" in messages
    assert messages[-1].startswith(best)
    caplog.clear()
    HeadTrainer(cfg).run()
    assert f"resumed from {tmp_path}/head/last.pt at epoch 1 batch 1 (step 1)" in caplog.messages
    assert "time budget reached at epoch 1 batch 2 (step 2)" in caplog.messages
    assert caplog.messages[-1].startswith("best head: ")


def test_heads_that_cover_alike_are_ranked_by_agreement_then_loss() -> None:
    """A short run's heads may all cover 0.000 of the target's top 5: best.pt must still
    be the better one, not the first."""

    def valid(cover: float, top1: float, loss: float) -> list[dict]:
        return [{"top5_in_10": cover, "top1": top1, "loss": loss}] * 3

    early, later, sharper = valid(0.0, 0.10, 7.5), valid(0.0, 0.10, 7.2), valid(0.0, 0.12, 7.4)
    assert head_score(later) > head_score(early)
    assert head_score(sharper) > head_score(later)
    assert head_score(valid(0.01, 0.0, 9.0)) > head_score(sharper)
