import pytest
import torch
from torch.nn.functional import linear as torch_linear

from specbeam.kernels import kernel_table, native, onednn
from specbeam.kernels.onednn import linear, linears, packed

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN"
)


@pytest.fixture(autouse=True)
def _enabled(use_runtime):
    """The vendor rule (the measured choice has its tests below): oneDNN at every row
    count, as on CPUs other than Intel's, without the extension's few-row product (its own
    tests below turn it on)."""
    use_runtime(onednn=True, onednn_min_rows=1, native=False, kernels="vendor")


needs_mkl = pytest.mark.skipif(
    not torch.backends.mkl.is_available(), reason="PyTorch built without MKL"
)


def weights(out: int = 96, inp: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=gen) / 8, torch.randn(out, generator=gen)


@pytest.mark.parametrize("shape", [(1, 64), (5, 64), (2, 27, 64)])
@pytest.mark.parametrize("with_bias", [True, False])
@torch.inference_mode()
def test_same_numbers_as_torch_linear(shape, with_bias):
    w, b = weights()
    x = torch.randn(shape)
    bias = b if with_bias else None
    got = linear(x, w, bias)
    assert got.shape == (*shape[:-1], 96)
    torch.testing.assert_close(got, torch_linear(x, w, bias), rtol=0, atol=1e-5)


@torch.inference_mode()
def test_bfloat16_within_its_rounding():
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("no bfloat16 oneDNN kernels on this CPU")
    w, b = (t.bfloat16() for t in weights())
    x = torch.randn(5, 64).bfloat16()
    torch.testing.assert_close(
        linear(x, w, b).float(), torch_linear(x, w, b).float(), atol=0.05, rtol=0.02
    )


def test_packs_once_and_repacks_when_the_weight_changes():
    w, b = weights()  # a model's weight: made outside inference mode, so it has a version
    x = torch.randn(3, 64)
    with torch.inference_mode():
        first = packed(w)
        assert first is not None and packed(w) is first
    with torch.no_grad():
        w.mul_(2)  # an in-place update: the packed copy is stale
    with torch.inference_mode():
        assert packed(w) is not first
        torch.testing.assert_close(linear(x, w, b), torch_linear(x, w, b), rtol=0, atol=1e-5)


def test_follows_a_module_cast_back_and_forth():
    """`Module.to(dtype)` keeps the parameter object and swaps its data."""
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        before = linear(x, layer.weight, layer.bias)
    layer.to(torch.bfloat16).to(torch.float32)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x, layer.weight, layer.bias), before, rtol=0, atol=1e-2)
        assert packed(layer.weight).dtype == torch.float32


def test_autograd_runs_torch_linear():
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(4, 64)
    linear(x, layer.weight, layer.bias).sum().backward()
    assert layer.weight.grad is not None
    assert layer.weight not in onednn._packed
    assert torch.equal(
        linear(x, layer.weight, layer.bias), torch_linear(x, layer.weight, layer.bias)
    )


@torch.inference_mode()
def test_switched_off_packs_nothing(use_runtime):
    w, b = weights()
    x = torch.randn(7, 64)
    use_runtime(onednn=False)
    assert torch.equal(linear(x, w, b), torch_linear(x, w, b))
    assert w not in onednn._packed
    use_runtime(onednn=True)
    linear(x, w, b)
    assert w in onednn._packed


@torch.inference_mode()
def test_a_mixed_dtype_call_is_left_to_torch():
    w, b = weights()
    x = torch.randn(2, 64, dtype=torch.float64)
    with pytest.raises(RuntimeError):  # what torch says about mixed dtypes, unchanged
        linear(x, w, b)


def group(seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """Three projections of one input, the middle one without a bias (as a k_proj may be)."""
    (wq, bq), (wk, _), (wv, bv) = (weights(32, 64, seed + i) for i in range(3))
    return [wq, wk, wv], [bq, None, bv]


@pytest.mark.parametrize("shape", [(1, 64), (2, 27, 64)])
@torch.inference_mode()
def test_stacked_linears_give_each_projection_its_own_output(shape):
    ws, bs = group()
    x = torch.randn(shape)
    got = linears(x, ws, bs)
    assert [t.shape for t in got] == [(*shape[:-1], 32)] * 3
    for out, w, b in zip(got, ws, bs, strict=True):
        torch.testing.assert_close(out, torch_linear(x, w, b), rtol=0, atol=1e-5)


def test_stacked_linears_repack_when_any_weight_changes():
    ws, bs = group()
    x = torch.randn(3, 64)
    with torch.inference_mode():
        linears(x, ws, bs)
        first = onednn._fused[ws[0]]
        linears(x, ws, bs)
        assert onednn._fused[ws[0]] is first
    with torch.no_grad():
        ws[2].mul_(2)  # not the weight the group is filed under
    with torch.inference_mode():
        got = linears(x, ws, bs)
        assert onednn._fused[ws[0]] is not first
    torch.testing.assert_close(got[2], torch_linear(x, ws[2], bs[2]), rtol=0, atol=1e-5)


def test_stacked_linears_run_torch_under_autograd_and_when_off(use_runtime):
    ws, bs = group()
    x = torch.randn(4, 64)
    ws[0].requires_grad_(True)
    sum(t.sum() for t in linears(x, ws, bs)).backward()
    assert ws[0].grad is not None and ws[0] not in onednn._fused
    use_runtime(onednn=False)
    with torch.inference_mode():
        got = linears(x, ws, bs)
    assert ws[0] not in onednn._fused
    assert all(torch.equal(o, torch_linear(x, w, b)) for o, w, b in zip(got, ws, bs, strict=True))


@torch.inference_mode()
def test_fp32_products_below_min_rows_run_torch_linear(use_runtime):
    """Bit for bit torch's below the threshold (MKL's kernels); oneDNN from it on."""
    w, b = weights()
    stacked = [weights(seed=s) for s in (1, 2)]
    use_runtime(onednn_min_rows=4)
    few, many = torch.randn(3, 64), torch.randn(2, 2, 64)
    assert torch.equal(linear(few, w, b), torch_linear(few, w, b))
    outs = linears(few, [s[0] for s in stacked], [s[1] for s in stacked])
    for out, (ws, bs) in zip(outs, stacked, strict=True):
        assert torch.equal(out, torch_linear(few, ws, bs))
    packed_out = torch.ops.mkldnn._linear_pointwise(many, packed(w), b, "none", [], "")
    assert torch.equal(linear(many, w, b), packed_out)


@needs_mkl
@pytest.mark.parametrize("with_bias", [True, False])
@torch.inference_mode()
def test_a_recurring_row_count_runs_on_a_weight_packed_for_it(with_bias, use_runtime):
    """Torch's own MKL call until the count has recurred, then MKL's packed GEMM: the same
    numbers up to fp32 rounding, for plain and stacked linears alike."""
    use_runtime(onednn_min_rows=8)
    w, b = weights()
    bias = b if with_bias else None
    ws, bs = group()
    for use in range(onednn.PACK_AFTER + 2):
        x = torch.randn(5, 64) if use % 2 else torch.randn(1, 5, 64)
        got = linear(x, w, bias)
        stacked = linears(x, ws, bs)
        if use < onednn.PACK_AFTER - 1:
            assert torch.equal(got, torch_linear(x, w, bias))
        torch.testing.assert_close(got, torch_linear(x, w, bias), rtol=0, atol=1e-5)
        for out, wi, bi in zip(stacked, ws, bs, strict=True):
            torch.testing.assert_close(out, torch_linear(x, wi, bi), rtol=0, atol=1e-5)
    assert list(onednn._row_packs[w].packed) == [5]
    assert list(onednn._row_packs[onednn._fused[ws[0]][2]].packed) == [5]


@needs_mkl
@torch.inference_mode()
def test_at_most_a_few_row_counts_are_packed_per_weight(use_runtime):
    use_runtime(onednn_min_rows=8)
    w, b = weights()
    for rows in range(1, 8):
        for _ in range(onednn.PACK_AFTER):
            linear(torch.randn(rows, 64), w, b)
    packs = onednn._row_packs[w].packed
    first = onednn.MIN_PACKED_ROWS
    assert list(packs) == list(range(first, first + onednn.MAX_ROW_COUNTS))
    for rows in (first - 1, 7):  # too few to gain, or over the limit: torch's own call
        x = torch.randn(rows, 64)
        assert torch.equal(linear(x, w, b), torch_linear(x, w, b))


@needs_mkl
def test_a_changed_weight_drops_its_row_packings(use_runtime):
    use_runtime(onednn_min_rows=8)
    w, b = weights()
    x = torch.randn(5, 64)
    with torch.inference_mode():
        for _ in range(onednn.PACK_AFTER):
            linear(x, w, b)
        assert 5 in onednn._row_packs[w].packed
    with torch.no_grad():
        w.mul_(2)
    with torch.inference_mode():
        assert torch.equal(linear(x, w, b), torch_linear(x, w, b))
        assert not onednn._row_packs[w].packed


def _extension_in_use(use_runtime):
    if native.build() is None:
        pytest.skip("the extension is not built here")
    use_runtime(native=True)


@pytest.mark.parametrize("with_bias", [True, False])
@torch.inference_mode()
def test_few_rows_run_the_extensions_product_a_row_alone(with_bias, use_runtime):
    """Up to MAX_FEW_ROWS rows: fp32 sums within rounding of torch's, and a
    row's result the same bits whatever rows share its call, for plain and stacked
    linears; more rows, or a width the product does not take, run oneDNN."""
    _extension_in_use(use_runtime)
    w, b = weights(out=45, inp=64)
    bias = b if with_bias else None
    ws, bs = group()
    rows = onednn.MAX_FEW_ROWS
    x = torch.randn(2, rows, 64)
    for n in range(1, rows + 1):
        assert onednn.resolve(n, x.dtype, w, bias).kind == onednn.FEW_ROWS
        got = linear(x[0, :n], w, bias)
        torch.testing.assert_close(got, torch_linear(x[0, :n], w, bias), rtol=0, atol=1e-5)
        assert all(torch.equal(got[i], linear(x[0, i : i + 1], w, bias)[0]) for i in range(n))
        stacked = linears(x[0, :n], ws, bs)
        alone = linears(x[0, n - 1 : n], ws, bs)
        for out, one, wi, bi in zip(stacked, alone, ws, bs, strict=True):
            torch.testing.assert_close(out, torch_linear(x[0, :n], wi, bi), rtol=0, atol=1e-5)
            assert torch.equal(out[n - 1], one[0])
    assert onednn.resolve(rows + 1, x.dtype, w, bias).kind == onednn.ONEDNN
    odd = torch.randn(45, 60)
    assert onednn.resolve(1, x.dtype, odd, None).kind == onednn.ONEDNN
    assert torch.equal(linear(x, w, bias).flatten(0, 1), linear(x.flatten(0, 1), w, bias))


@pytest.mark.parametrize("avx512", [True, False])
@torch.inference_mode()
def test_on_avx512_few_rows_take_only_products_of_few_inputs(monkeypatch, use_runtime, avx512):
    """On AVX-512 oneDNN wins once rows × in exceeds `AVX512_FEW_ROWS_INPUTS` (a
    feed-forward output's 2048 inputs from 2 rows); on AVX2 the own product takes up to
    `MAX_FEW_ROWS` rows of any width."""
    _extension_in_use(use_runtime)
    monkeypatch.setattr(onednn, "_avx512", lambda: avx512)
    wide, _ = weights(out=16, inp=2048)
    for n in range(1, onednn.MAX_FEW_ROWS + 1):
        own = not avx512 or n * 2048 <= onednn.AVX512_FEW_ROWS_INPUTS
        assert onednn.resolve(n, torch.float32, wide, None).kind == (onednn.FEW_ROWS if own else onednn.ONEDNN)  # fmt: skip
    narrow, _ = weights(out=16, inp=512)
    assert onednn.resolve(5, torch.float32, narrow, None).kind == onednn.FEW_ROWS


def test_packings_live_as_long_as_their_weight():
    """Kept by id, so a dead weight's entry must go with it, and a new tensor never
    finds another's packing."""
    store = onednn._PerTensor()
    w = torch.randn(4, 4)
    store[w] = "packed"
    assert w in store and store[w] == "packed"
    other = torch.randn(4, 4)
    assert other not in store and store.get(other) is None
    del w
    assert not store._entries
    with pytest.raises(KeyError):
        store[other]


class ForcedTable:
    """A kernel table that chooses `kind` wherever it is a candidate, and records the
    candidates it was offered."""

    def __init__(self, kind: str) -> None:
        self.kind, self.offered = kind, []

    def choose(self, rows, weight, names, candidates) -> str:
        self.offered.append(names)
        return self.kind if self.kind in names else names[-1]


@pytest.mark.parametrize(
    ("choice", "kind"),
    [("mkl", onednn.TORCH), ("onednn", onednn.ONEDNN), ("few_rows", onednn.FEW_ROWS)],
)
@torch.inference_mode()
def test_measured_kernels_run_what_the_table_chose(monkeypatch, use_runtime, choice, kind):
    """`kernels: measured`: a plain or stacked fp32 product runs the table's choice,
    within rounding of torch's numbers; the few-row product is offered up to
    `MAX_FEW_ROWS` rows of any width where the extension runs."""
    _extension_in_use(use_runtime)
    use_runtime(kernels="measured")
    table = ForcedTable(choice)
    monkeypatch.setattr(kernel_table, "current", lambda: table)
    w, b = weights(out=45, inp=2048)
    x = torch.randn(5, 2048)
    assert onednn.resolve(5, x.dtype, w, b).kind == kind
    torch.testing.assert_close(linear(x, w, b), torch_linear(x, w, b), rtol=0, atol=1e-4)
    assert "few_rows" in table.offered[-1]  # 5 × 2048 inputs: beyond the vendor rule's limit
    ws, bs = group()
    group_x = torch.randn(5, 64)
    assert onednn.resolve_group(5, group_x.dtype, ws, bs).kind == kind
    onednn.resolve(onednn.MAX_FEW_ROWS + 1, x.dtype, w, b)
    assert "few_rows" not in table.offered[-1]


@needs_mkl
@torch.inference_mode()
def test_a_measured_mkl_packed_choice_packs_once_the_count_recurs(monkeypatch, use_runtime):
    use_runtime(kernels="measured")
    monkeypatch.setattr(kernel_table, "current", lambda: ForcedTable("mkl_packed"))
    w, b = weights(out=96, inp=64, seed=3)
    kinds = [onednn.resolve(6, torch.float32, w, b).kind for _ in range(onednn.PACK_AFTER + 1)]
    assert kinds[0] == onednn.TORCH and kinds[-1] == onednn.MKL


@torch.inference_mode()
def test_every_kernel_the_table_times_gives_torchs_numbers(use_runtime):
    _extension_in_use(use_runtime)
    w, b = weights(out=40, inp=64, seed=5)
    names = tuple(n for n in onednn.FP32_KINDS if n != "mkl_packed" or torch.backends.mkl.is_available())  # fmt: skip
    candidates = onednn._timed(w, b, names, 5)(3)
    assert set(candidates) == set(names)
    x = torch.randn(5, 64)
    for name, run in candidates.items():
        for copy in range(3):
            torch.testing.assert_close(run(x, copy), torch_linear(x, w, b), rtol=0, atol=1e-5, msg=name)  # fmt: skip


@torch.inference_mode()
def test_the_first_measured_product_fills_the_table(tmp_path, monkeypatch, use_runtime):
    use_runtime(kernels="measured")
    table = kernel_table.KernelTable(tmp_path / "products.json")
    monkeypatch.setattr(kernel_table, "current", lambda: table)
    w, b = weights(out=64, inp=64, seed=7)
    linear(torch.randn(3, 64), w, b)
    (key,) = table.choices
    assert "3 rows, 64x64" in key and table.choices[key] in onednn.FP32_KINDS
