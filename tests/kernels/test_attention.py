"""The lean layers' attention: a query's result depends only on the keys it sees and
their order, bit for bit; it is softmax attention within fp32 rounding; fairseq2's modules
run it over the masks their SDPA would apply; elsewhere it falls back to fp64."""

from __future__ import annotations

import copy

import pytest
import torch
from fairseq2.models.transformer import NaiveSDPA, StandardMultiheadAttention

from specbeam.kernels import attention, native, quant

HEADS = 3


def _sdpa64(q, k, v, bias):
    mask = None if bias is None else bias.double()
    return attention.sdpa(q.double(), k.double(), v.double(), mask).float()


def _qkv(s: int, t: int, keys: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, n, HEADS, dim, generator=gen) for n in (t, keys, keys))
    return q, k, v


def _mask(visible: torch.Tensor) -> torch.Tensor:
    """visible (S, T, K) bool -> additive (S, 1, T, K)."""
    return torch.zeros(visible.shape).masked_fill_(~visible, -torch.inf).unsqueeze(1)


def test_the_kernel_is_built_here() -> None:
    """Else every test below compares the fp64 fallback with itself."""
    assert native.build() is not None


@pytest.mark.parametrize("dim", [8, 16, 40, 48, 64, 72, 80, 96, 120, 128, 136])
@torch.inference_mode()
def test_softmax_attention_within_fp32_rounding(dim) -> None:
    """Head dims below one 16-lane chunk, of whole chunks and with a tail (the kernel is
    compiled once per chunk count); no mask, a random mask, and keys read through a
    strided view (the cache's)."""
    q, k, v = _qkv(2, 5, 40, dim)
    visible = torch.rand(2, 5, 30, generator=torch.Generator().manual_seed(1)) < 0.6
    visible[..., 0] = True
    for keys, values, bias in ((k, v, None), (k[:, :30], v[:, :30], _mask(visible))):
        want = _sdpa64(q, keys, values, bias)
        torch.testing.assert_close(
            attention.attend(q, keys, values, bias), want, atol=2e-6, rtol=1e-5
        )


@torch.inference_mode()
def test_a_query_depends_only_on_the_keys_it_sees_in_their_order() -> None:
    """The same query over the same 7 keys: alone, then beside 12 other queries, with
    masked keys interleaved (other hypotheses' prefixes in the cache) and more keys after
    (tree slots), and beside other sources. Bit for bit: a verification and a plain step
    round a quantized target's next product alike."""
    dim = 64
    q, k, v = _qkv(1, 1, 7, dim)
    alone = attention.attend(q, k, v, None)
    big_q, big_k, big_v = _qkv(3, 13, 40, dim, seed=2)
    where = torch.tensor([1, 5, 9, 13, 17, 21, 25])  # every 4th key, from the 2nd
    big_q[1, 6], big_k[1, where], big_v[1, where] = q[0, 0], k[0], v[0]
    visible = torch.rand(3, 13, 40, generator=torch.Generator().manual_seed(3)) < 0.5
    visible[1, 6] = False
    visible[1, 6, where] = True
    together = attention.attend(big_q, big_k, big_v, _mask(visible))
    assert torch.equal(together[1, 6], alone[0, 0])


@torch.inference_mode()
def test_a_query_that_sees_nothing_reads_zeros() -> None:
    """As torch's SDPA: the padding slots of a batched verification stay finite."""
    q, k, v = _qkv(1, 2, 5, 16)
    visible = torch.ones(1, 2, 5, dtype=torch.bool)
    visible[0, 1] = False
    out = attention.attend(q, k, v, _mask(visible))
    assert torch.equal(out[0, 1], torch.zeros(HEADS * 16))
    assert out[0, 0].abs().sum() > 0


@torch.inference_mode()
def test_without_the_extension_it_attends_in_fp64(monkeypatch) -> None:
    q, k, v = _qkv(2, 3, 9, 16)
    bias = _mask(torch.rand(2, 3, 9, generator=torch.Generator().manual_seed(4)) < 0.7)
    kernel = attention.attend(q, k, v, bias)
    monkeypatch.setattr(native, "build", lambda: None)
    fallback = attention.attend(q, k, v, bias)
    assert torch.equal(fallback, _sdpa64(q, k, v, bias))
    torch.testing.assert_close(kernel, fallback, atol=2e-6, rtol=1e-5)


@torch.inference_mode()
def test_fairseq2_modules_attend_here_over_their_own_masks(tiny_target, tiny_draft) -> None:
    """A quantized target's decoder (causal self-attention over the prompt) and encoder
    (padded sources) through fairseq2's modules: the same numbers as before ordering,
    within fp32 rounding."""
    from specbeam.data.batches import pad
    from tests.conftest import sources

    model = copy.deepcopy(tiny_target)
    src, layout = pad(sources(seed=5, batch=3), 0)
    tgt, tgt_layout = pad([torch.tensor([3, 5, 30, 31, 32])] * 3, 0)
    want = model(src, layout, tgt, tgt_layout)
    attention.order(model)
    assert all(
        isinstance(m.sdpa, attention.OrderedSDPA)
        for m in model.modules()
        if isinstance(m, StandardMultiheadAttention)
    )
    torch.testing.assert_close(model(src, layout, tgt, tgt_layout), want, atol=2e-5, rtol=1e-4)


def test_attention_it_cannot_order_is_refused(tiny_target) -> None:
    model = copy.deepcopy(tiny_target)
    assert attention.order_problem(model) is None
    layer = model.decoder.layers[0].self_attn
    layer.sdpa = NaiveSDPA(layer.sdpa.bias)
    assert attention.order_problem(model) == (
        "its attention runs NaiveSDPA, not TorchSDPA with the default scale"
    )
    with pytest.raises(ValueError, match="NaiveSDPA"):
        quant.quantize(model, "int8")
    assert not any(isinstance(m, quant.QuantizedLinear) for m in model.modules())
