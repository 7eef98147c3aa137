"""The lean encoder computes what fairseq2's encoder computes, on padded batches; encoders
it cannot run keep fairseq2's path."""

from __future__ import annotations

import copy
import logging

import torch
from fairseq2.models.transformer import TransformerNormOrder

from specbeam.data.batches import pad
from specbeam.kernels.lean_encoder import encode, encoder_problem
from specbeam.search import tree_attention
from specbeam.search.tree_attention import TreeDecoder
from tests.conftest import sources
from tests.search.test_tree_attention import TOL


def test_lean_encoder_matches_fairseq2s_on_a_padded_batch(tiny_target) -> None:
    srcs = sources(seed=17, batch=3)
    assert len({len(s) for s in srcs}) > 1, "the batch must be padded"
    src, layout = pad(srcs, 0)
    assert encoder_problem(tiny_target.encoder) is None
    with torch.inference_mode():
        x, layout = tiny_target.encoder_frontend(src, layout)
        want = tiny_target.encoder(x, layout)
        got = encode(tiny_target.encoder, x, list(layout.seq_lens))
    for row, n in enumerate(layout.seq_lens):  # padding rows are garbage on both paths
        assert torch.allclose(got[row, :n], want[row, :n], atol=TOL), (got - want).abs().max()


def test_lean_decoders_encode_on_the_lean_path(tiny_target, monkeypatch) -> None:
    calls = []

    def spy(*args):
        calls.append(args)
        return encode(*args)

    monkeypatch.setattr(tree_attention, "encode", spy)
    src, layout = pad(sources(seed=19, batch=2), 0)
    with torch.inference_mode():
        lean, plain = (
            TreeDecoder(tiny_target, src, layout, hyps_per_source=1, capacity=16, lean=flag)
            for flag in (True, False)
        )
    want, got = plain.encoder_output, lean.encoder_output
    for row, n in enumerate(layout.seq_lens):
        assert torch.allclose(got[row, :n], want[row, :n], atol=TOL)
    assert len(calls) == 1  # the lean decoder's encoding; the other ran fairseq2's modules
    monkeypatch.setattr(tree_attention, "MAX_TOKENS", src.numel() - 1)
    with torch.inference_mode():
        TreeDecoder(tiny_target, src, layout, hyps_per_source=1, capacity=16, lean=True)
    assert len(calls) == 1  # a batch of more tokens: fairseq2's modules (MKL wins there)


def test_encoders_the_lean_path_cannot_run_keep_fairseq2s(tiny_target, caplog) -> None:
    caplog.set_level(logging.INFO, logger="specbeam.search.tree_attention")
    post = copy.deepcopy(tiny_target)
    post.encoder.layers[0].norm_order = TransformerNormOrder.POST
    assert encoder_problem(post.encoder) == "norm order POST"
    src, layout = pad(sources(seed=5, batch=1), 0)
    with torch.inference_mode():
        x, seqs_layout = post.encoder_frontend(src, layout)
        want = post.encoder(x, seqs_layout)
        dec = TreeDecoder(post, src, layout, hyps_per_source=1, capacity=16, lean=True)
    assert torch.equal(dec.encoder_output, want)
    assert "encoder runs through fairseq2's modules: norm order POST" in caplog.text
    post.encoder.layers[0].norm_order = TransformerNormOrder.PRE
    post.encoder.register_forward_hook(lambda *_: None)
    assert encoder_problem(post.encoder) == "hooks"
