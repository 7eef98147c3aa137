"""Reduced-precision targets: each row of a product is computed alone, every path (the
fairseq2 modules, the lean decoder in Python, the native layers) computes the same
numbers, and exact speculative search reproduces beam search on the quantized target
(fairseq2's `BeamSearchSeq2SeqGenerator` on the same quantized modules, and specbeam's
lean plain search). Comparison rule as in test_generator.py."""

from __future__ import annotations

import copy
import dataclasses
import sys

import pytest
import torch
from fairseq2.nn import Linear, Projection

from specbeam.data.batches import pad
from specbeam.kernels import attention, onednn, quant
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead, HeadArch
from tests.conftest import sources
from tests.kernels.test_native import test_native_layers_match_the_python_loop_bit_for_bit
from tests.search.test_generator import Case, assert_same, run_both

PRECISIONS = [
    "int8",
    pytest.param(
        "bfloat16",
        marks=pytest.mark.skipif(
            not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="no native bf16 here"
        ),
    ),
]


def quantized_linear(
    precision: str, out: int = 96, inp: int = 64, seed: int = 0, bias: bool = False
) -> quant.QuantizedLinear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(inp, out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out, inp, generator=gen) / 8)
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(out, generator=gen))
    return quant.QuantizedLinear(layer, precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("inp", [64, 512])
@torch.inference_mode()
def test_a_row_is_the_same_in_any_company(precision, inp) -> None:
    """Rows 0, 3 and the last alone, and inside 5, 27 and 100 rows: bit-equal."""
    proj = quantized_linear(precision, out=200, inp=inp, bias=True)
    x = torch.randn(100, inp) * torch.logspace(-2, 2, 100)[:, None]  # rows of any magnitude
    for rows in (5, 27, 100):
        together = onednn.project(x[:rows], proj)
        for i in (0, 3, rows - 1):
            assert torch.equal(together[i], onednn.project(x[i : i + 1], proj)[0])


@pytest.mark.parametrize("precision", PRECISIONS)
@torch.inference_mode()
def test_close_to_the_fp32_product(precision) -> None:
    proj = quantized_linear(precision, inp=512, bias=True)
    x = torch.randn(27, 512)
    want = torch.nn.functional.linear(x, proj.weight, proj.bias)
    error = (onednn.project(x, proj) - want).norm() / want.norm()
    # Rounding each factor to 8 significant bits (bf16) or to one of 255 steps of its
    # row's or channel's largest magnitude (int8, about 4 steps per standard deviation
    # here): errors of a few tenths of a percent to a percent, at random signs.
    assert error < (0.02 if precision == "int8" else 0.005), error


@pytest.mark.parametrize("precision", PRECISIONS)
@torch.inference_mode()
def test_stacked_weights_compute_their_rows_alone(precision) -> None:
    """q, k and v stacked into one product give what three products give (the fairseq2
    modules run them one by one)."""
    projs = [quantized_linear(precision, seed=s, bias=s != 1) for s in range(3)]
    x = torch.randn(2, 7, 64)
    stacked = onednn.projects(x, projs)
    assert onednn.resolve_projections(14, x.dtype, projs) is not None
    for proj, got in zip(projs, stacked, strict=True):
        assert torch.equal(got, proj(x))


@torch.inference_mode()
def test_fbgemm_sums_are_the_exact_integers() -> None:
    """Weights at this CPU's levels (±63 where AVX2's 16-bit pair sums would saturate 8-bit
    ones) and inputs at ±127 of one sign: fbgemm gives `_int_mm`'s integers."""
    extension = quant.fbgemm_sums()
    if extension is None:
        pytest.skip("no extension (or no AVX2) here: the sums run on _int_mm")
    levels = quant.weight_levels()
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-levels, levels + 1, (200, 512), generator=gen, dtype=torch.int8)
    q[:100, :] = levels
    q[100:120, :] = -levels
    x = torch.randint(-127, 128, (27, 512), generator=gen, dtype=torch.int8)
    x[:5] = 127
    sums = extension.int8_sums(x, extension.int8_pack(q))
    assert torch.equal(sums, torch._int_mm(x, q.t().contiguous()))
    assert torch.equal(sums.long(), x.long() @ q.long().t())


@torch.inference_mode()
def test_the_extensions_int8_product_is_the_torch_ops_bit_for_bit() -> None:
    """Where the sums run on fbgemm the product runs in the extension: its row rounding,
    sums and scales give the bits of `quant.int8_product`'s torch ops over `_int_mm`."""
    extension = quant.fbgemm_sums()
    if extension is None:
        pytest.skip("no extension (or no AVX2) here: the sums run on _int_mm")
    copy = quantized_linear("int8", out=200, inp=512).quantized()
    assert copy.fbgemm is not None and copy.scales is not None
    torch_ops = dataclasses.replace(copy, fbgemm=None, fbgemm_rows=0)
    x = torch.randn(27, 512) * torch.logspace(-2, 2, 27)[:, None]
    bias = torch.randn(200)
    for b in (bias, None):
        want = quant.int8_product(x, torch_ops, b)
        assert torch.equal(extension.int8_product(x, True, copy.fbgemm, copy.scales, b), want)
        assert torch.equal(quant.int8_product(x, copy, b), want)


class _Fbgemm:
    """fbgemm's sums as its AVX2 kernel adds them (`saturate`: each two u8 × s8 products
    into 16 bits with saturation) or as VNNI does (each into 32 bits)."""

    def __init__(self, saturate: bool) -> None:
        self.saturate = saturate

    def int8_pack(self, q: torch.Tensor) -> torch.Tensor:
        return q

    def int8_sums(self, x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        u = x.long() + 128
        pairs = (u[:, None, :] * q.long()[None]).unflatten(-1, (-1, 2)).sum(-1)
        if self.saturate:
            pairs = pairs.clamp(-(2**15), 2**15 - 1)
        return (pairs.sum(-1) - 128 * q.long().sum(1)).int()


@pytest.mark.parametrize("saturate", [True, False])
def test_the_probe_finds_whether_fbgemm_keeps_8_bit_weights(saturate) -> None:
    assert quant.fbgemm_full_bits(_Fbgemm(saturate)) is not saturate


@pytest.mark.parametrize(
    ("flags", "built", "full_bits", "levels", "fbgemm_rows"),
    [(["avx2"], True, False, 63, sys.maxsize),
     (["avx2", "avx512_vnni"], True, True, 127, sys.maxsize),
     (["avx2", "avx512_vnni", "amx_int8"], True, True, 127, quant.FBGEMM_MAX_ROWS),
     (["avx2", "avx512_vnni"], False, True, 127, 0), (["avx512f"], True, True, 127, 0)],
)  # fmt: skip
@torch.inference_mode()
def test_int8_sums_run_on_fbgemm_up_to_its_rows(
    monkeypatch, flags, built, full_bits, levels, fbgemm_rows
) -> None:
    """fbgemm takes every call where the extension is built on AVX2, except those above
    `FBGEMM_MAX_ROWS` rows where `_int_mm` has AMX; weights keep 7 bits where its sums
    would saturate 8-bit ones."""
    from specbeam.kernels import cpu, native

    extension = native.build()
    if extension is None:
        pytest.skip("no extension here")
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    monkeypatch.setattr(native, "build", lambda: extension if built else None)
    monkeypatch.setattr(quant, "fbgemm_full_bits", lambda _: full_bits)
    proj = quantized_linear("int8", inp=512)
    copy = proj.quantized()
    assert quant.weight_levels() == levels
    assert int(copy.data.abs().max()) == levels
    assert copy.fbgemm_rows == fbgemm_rows and (copy.fbgemm is not None) == (fbgemm_rows > 0)
    for rows in (1, 5, quant.FBGEMM_MAX_ROWS + 1):
        kind = onednn.resolve_projection(rows, torch.float32, proj).kind
        assert kind == (onednn.INT8_FBGEMM if rows <= fbgemm_rows else onednn.INT8)


@torch.inference_mode()
def test_a_row_is_the_same_on_either_kernel(monkeypatch) -> None:
    """Where the kernel changes with the row count, a row alone (on fbgemm) and in a
    call of 27 (on `_int_mm`) gives the same bits."""
    if quant.fbgemm_sums() is None:
        pytest.skip("no extension (or no AVX2) here: the sums run on _int_mm")
    monkeypatch.setattr(quant, "fbgemm_rows", lambda: 4)
    proj = quantized_linear("int8", out=200, inp=512, bias=True)
    x = torch.randn(27, 512) * torch.logspace(-2, 2, 27)[:, None]
    together = proj(x)
    for i in range(27):
        assert torch.equal(proj(x[i : i + 1]), together[i : i + 1])


def test_quantizes_fp32_cpu_weights_only() -> None:
    with pytest.raises(ValueError, match="precision"):
        quant.QuantizedLinear(Linear(4, 4, bias=False), "float16")
    with pytest.raises(ValueError, match="fp32"):
        quant.QuantizedLinear(Linear(4, 4, bias=False, dtype=torch.bfloat16), "int8")
    with pytest.raises(ValueError, match="replaced in its parent"):
        quant.quantize(Linear(4, 4, bias=False), "int8")


def test_a_changed_weight_is_quantized_again() -> None:
    layer = quant.QuantizedLinear(Linear(64, 32, bias=True), "int8")
    x = torch.randn(3, 64)
    with torch.inference_mode():
        before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    with torch.inference_mode():
        after = layer(x)
    torch.testing.assert_close(after - layer.bias, 2 * (before - layer.bias), atol=1e-4, rtol=0)
    layer.to(torch.bfloat16)
    with pytest.raises(ValueError, match="dequantize it first"):
        layer(x.bfloat16())


def test_a_copy_quantizes_its_own_weight_and_dequantize_puts_the_layer_back() -> None:
    layer = Linear(64, 32, bias=True)
    model = quant.quantize(torch.nn.Sequential(layer), "int8")
    x = torch.randn(3, 64)
    with torch.inference_mode():
        want = model(x)
    twin = copy.deepcopy(model)
    assert twin[0].weight is not layer.weight and twin[0]._copy is None
    with torch.inference_mode():
        assert torch.equal(twin(x), want)
    assert quant.dequantize(model)[0] is layer


def test_a_heads_cast_copy_of_a_quantized_projection_runs_its_own_dtype(tiny_target) -> None:
    """A draft head's bf16 copy of the target's final projection is not quantized, nor are
    the layers it copies from a quantized target."""
    target = quant.quantize(copy.deepcopy(tiny_target), "int8")
    head = DraftHead(target, HeadArch(num_layers=1))
    assert head.final_proj is target.final_proj
    assert not any(isinstance(m, quant.QuantizedLinear) for m in head.decoder.layers.modules())
    head.cast(torch.bfloat16)
    cast = head.final_proj
    assert not isinstance(cast, quant.QuantizedLinear) and cast.weight.dtype == torch.bfloat16
    assert cast.weight is head.decoder_frontend.embed.weight
    x = torch.randn(3, cast.weight.size(1), dtype=torch.bfloat16)
    torch.testing.assert_close(cast(x), torch.nn.functional.linear(x, cast.weight))
    assert isinstance(target.final_proj, quant.QuantizedLinear)


@pytest.fixture(scope="module", params=PRECISIONS)
def quantized(request, tiny_target):
    """The tiny target in reduced precision, and a draft head over it."""
    target = quant.quantize(copy.deepcopy(tiny_target), request.param)
    torch.manual_seed(3)
    head = DraftHead(target, HeadArch(num_layers=1)).eval()
    return target, head


def test_quantize_replaces_every_linear_layer(quantized) -> None:
    target, _ = quantized
    layers = [m for m in target.modules() if isinstance(m, Projection)]
    assert len(layers) > 1  # the layers' projections (sharded ones, over one rank) too
    assert all(type(m) is quant.QuantizedLinear for m in layers)
    assert all(m.precision in quant.PRECISIONS for m in layers)


def test_a_quantized_model_is_made_of_modules_and_its_weights_carry_no_marks(tiny_target):
    """No tensor carries an attribute, no module's class is swapped: the quantized
    projections are `QuantizedLinear`s over the same parameters, under the same names."""
    model = copy.deepcopy(tiny_target)
    before = dict(model.named_parameters())
    classes = {type(m) for m in model.modules()}
    quant.quantize(model, "int8")
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is p for k, p in before.items())
    assert model.state_dict().keys() == tiny_target.state_dict().keys()
    assert all(not vars(p) for p in model.parameters())
    assert all(not vars(b) for b in model.buffers())
    new = {type(m) for m in model.modules()} - classes
    assert new == {quant.QuantizedLinear, attention.OrderedSDPA}
    assert isinstance(model.final_proj, quant.QuantizedLinear)
    assert model.final_proj.weight is model.decoder_frontend.embed.weight  # still tied


@pytest.mark.parametrize("min_rows", [1, 10_000], ids=["onednn", "mkl"])
def test_native_layers_match_the_python_loop(quantized, monkeypatch, min_rows, use_runtime):
    test_native_layers_match_the_python_loop_bit_for_bit(
        quantized[0], monkeypatch, min_rows, use_runtime, kernel_attention=None
    )


def run_against_lean_plain(case: Case, target, draft, vocab_info):
    """specbeam's lean plain search and exact speculative search (lean target), as
    `run_both` builds fairseq2's and the speculative generator."""
    srcs = sources(seed=1000 + case.seed, batch=case.batch)
    src, src_layout = pad(srcs, 0)
    prompts, prompt_layout = pad([case.prompt] * case.batch, 0)
    common = dict(
        beam_size=case.beam_size, len_penalty=case.len_penalty, min_gen_len=case.min_gen_len,
        max_gen_len=case.max_gen_len, lean_target=True, **case.extra,
    )  # fmt: skip
    spec = {
        "gamma": case.gamma, "draft_strategy": case.strategy, "draft_width": case.draft_width,
        "max_draft_nodes": case.max_draft_nodes, **case.shape,
    }  # fmt: skip
    plain_gen = SpeculativeBeamSearchSeq2SeqGenerator(target, None, vocab_info, plain="lean", **common)  # fmt: skip
    spec_gen = SpeculativeBeamSearchSeq2SeqGenerator(target, draft, vocab_info, **spec, **common)
    try:
        plain = plain_gen(src, src_layout, prompts, prompt_layout)
    except ValueError:
        return None  # settings both refuse (test_generator.py checks the complaint)
    return plain, spec_gen(src, src_layout, prompts, prompt_layout)


@pytest.mark.parametrize("seed", range(60))
def test_equivalence_with_lean_plain_search(seed, quantized, tiny_draft, vocab_info) -> None:
    """Against specbeam's lean plain search on the quantized target: the products
    compute rows alone and attention each query alone, so the roundings to int8 or bf16
    are the same, and scores differ by fp32 rounding only (SCORE_TOL)."""
    result = run_against_lean_plain(Case.draw(seed), quantized[0], tiny_draft, vocab_info)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(1, 60, 2))
def test_equivalence_with_a_head_over_the_quantized_target(seed, quantized, vocab_info) -> None:
    """As above, drafted by a head that reads the quantized target's states."""
    target, head = quantized
    result = run_against_lean_plain(Case.draw(seed), target, head, vocab_info)
    if result is not None:
        assert_same(*result)


@pytest.mark.parametrize("seed", range(60, 90))
def test_equivalence_with_fairseq2_on_the_quantized_modules(
    seed, quantized, tiny_draft, vocab_info
):
    """Against fairseq2's beam search on the same quantized modules, the target run
    through them too. (The lean encoder and fairseq2's differ in the last fp32 bits, so
    a rounding to int8 or bf16 can differ between the two paths: each path is compared
    with its own plain search.)"""
    target, head = quantized
    draft = head if seed % 2 else tiny_draft
    result = run_both(Case.draw(seed), target, draft, vocab_info, lean_target=False)
    if result is not None:
        assert_same(*result)


@torch.inference_mode()
def test_a_sentence_translates_alike_alone_and_in_a_batch(quantized, tiny_draft, vocab_info):
    """Products, norms and attention compute each row or query alone, so a source's
    hypotheses and scores do not depend on the sources (and padding) beside it, bit for
    bit: in plain and in speculative search."""
    target = quantized[0]
    srcs = sources(seed=77, batch=4)
    options = dict(beam_size=3, gamma=2, max_gen_len=(2.0, 6), lean_target=True, plain="lean")
    prompt = torch.tensor([3, 5])
    for draft in (None, tiny_draft):
        gen = SpeculativeBeamSearchSeq2SeqGenerator(target, draft, vocab_info, **options)
        src, src_layout = pad(srcs, 0)
        prompts, prompt_layout = pad([prompt] * len(srcs), 0)
        together = gen(src, src_layout, prompts, prompt_layout).hypotheses
        for src, want in zip(srcs, together, strict=True):
            got = gen(*pad([src], 0), *pad([prompt], 0)).hypotheses[0]
            assert [h.seq.tolist() for h in got] == [h.seq.tolist() for h in want]
            assert [float(h.score) for h in got] == [float(h.score) for h in want]
