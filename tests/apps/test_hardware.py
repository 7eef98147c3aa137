import copy

import pytest
import torch
from fairseq2.nn import Projection

from specbeam.apps.decoding import DecodingConfig, load_decoding
from specbeam.apps.hardware import HardwareConfig, auto_choice, load_hardware
from specbeam.integration.models import LoadedPair
from specbeam.kernels import attention, cpu, onednn, quant
from specbeam.kernels import native as nativelib
from specbeam.search.head import DraftHead, HeadArch


def test_drafts_load_in_float32_but_for_an_explicit_bfloat16() -> None:
    """auto chooses once the draft is loaded (`place`): an int8 head quantizes fp32 weights."""
    assert HardwareConfig(draft_dtype="auto").draft_torch_dtype == torch.float32
    assert HardwareConfig(draft_dtype="int8").draft_torch_dtype == torch.float32
    assert HardwareConfig(draft_dtype="float32").draft_torch_dtype == torch.float32
    assert HardwareConfig(draft_dtype="bfloat16").draft_torch_dtype == torch.bfloat16


def test_cpu_config_chooses_the_draft_dtype_by_the_cpu() -> None:
    assert load_hardware("cpu").draft_dtype == "auto"


def test_unknown_dtype_names_the_setting_and_what_is_allowed() -> None:
    with pytest.raises(
        ValueError,
        match="hardware.draft_dtype=fp8 is invalid: allowed: float32, bfloat16, int8, auto",
    ):
        HardwareConfig(draft_dtype="fp8").apply()
    with pytest.raises(
        ValueError,
        match="hardware.target_dtype=float16 is invalid: allowed: float32, bfloat16, int8, auto$",
    ):
        HardwareConfig(target_dtype="float16").apply()


AUTO_CASES = [
    (True, True, True, "int8"), (True, False, True, "int8"), (False, True, True, "bfloat16"),
    (False, False, True, "int8"), (False, False, False, "float32"),
]  # fmt: skip
"""fbgemm built, native bf16, int8 native -> auto's precision."""


@pytest.mark.parametrize(("fbgemm", "bf16", "int8", "auto"), AUTO_CASES)
def test_auto_target_dtype_follows_the_cpu(monkeypatch, fbgemm, bf16, int8, auto) -> None:
    monkeypatch.setattr(quant, "fbgemm_sums", lambda: object() if fbgemm else None)
    monkeypatch.setattr(onednn, "bf16_native", lambda: bf16)
    monkeypatch.setattr(onednn, "int8_native", lambda: int8)
    assert HardwareConfig(target_dtype="auto").target_precision == auto
    assert HardwareConfig(target_dtype="int8").target_precision == ("int8" if int8 else "float32")  # fmt: skip


@pytest.mark.parametrize(("fbgemm", "bf16", "int8", "auto"), AUTO_CASES)
def test_auto_target_dtype_says_what_it_chose_and_why(
    monkeypatch, caplog, tiny_target, fbgemm, bf16, int8, auto
) -> None:
    """auto names no precision: one line does, with the CPU's reason."""
    monkeypatch.setattr(quant, "fbgemm_sums", lambda: object() if fbgemm else None)
    monkeypatch.setattr(onednn, "bf16_native", lambda: bf16)
    monkeypatch.setattr(onednn, "int8_native", lambda: int8)
    precision, why = auto_choice()
    assert precision == auto and "this CPU" in why
    if auto != "float32":
        return  # quantizing needs the CPU support the case fakes
    pair = LoadedPair(tokenizer=None, target=copy.deepcopy(tiny_target), draft=None)  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="specbeam.hardware"):
        HardwareConfig(target_dtype="auto").place(pair)
    assert [r.getMessage() for r in caplog.records] == [
        "hardware.target_dtype=auto: the target runs float32, as this CPU has neither native "
        "bf16 nor fast int8 products"
    ]


@pytest.mark.parametrize(
    ("flags", "built", "native"),
    [([], True, False), (["avx2"], False, False), (["avx2"], True, True),
     (["avx2", "avx512f", "avx512_vnni"], False, True), (["avx2", "avx_vnni"], False, True),
     (["avx2", "amx_int8"], False, True)],
)  # fmt: skip
def test_int8_is_native_with_vnni_amx_or_fbgemm_on_avx2(monkeypatch, flags, built, native) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    monkeypatch.setattr(nativelib, "build", lambda: object() if built else None)
    assert onednn.int8_native() is native and onednn.native("int8") is native
    assert onednn.native("float32")


def quantized(model: torch.nn.Module) -> bool:
    return any(isinstance(m, quant.QuantizedLinear) for m in model.modules())


def test_place_quantizes_the_target_in_its_precision(monkeypatch, tiny_target) -> None:
    monkeypatch.setattr(onednn, "int8_native", lambda: True)
    pair = LoadedPair(tokenizer=None, target=copy.deepcopy(tiny_target), draft=None)  # type: ignore[arg-type]
    HardwareConfig(target_dtype="int8").place(pair)
    layers = [m for m in pair.target.modules() if isinstance(m, Projection)]
    assert len(layers) > 1 and all(quant.precision_of(m) == "int8" for m in layers)
    assert all(p.dtype == torch.float32 for p in pair.target.parameters())


def test_a_float32_head_reads_the_quantized_targets_projection(monkeypatch, tiny_target):
    """As the target's own layers are replaced, so is the projection the head holds."""
    monkeypatch.setattr(onednn, "int8_native", lambda: True)
    target = copy.deepcopy(tiny_target)
    pair = LoadedPair(tokenizer=None, target=target, draft=DraftHead(target, HeadArch()))  # type: ignore[arg-type]
    HardwareConfig(target_dtype="int8").place(pair)
    assert isinstance(target.final_proj, quant.QuantizedLinear)
    assert pair.draft.final_proj is target.final_proj and pair.draft.encoder is target.encoder
    assert not quantized(pair.draft.decoder.layers) and pair.draft.feature_proj.weight.dtype == torch.float32  # fmt: skip


def test_an_int8_draft_head_is_quantized_and_the_target_is_not(monkeypatch, tiny_target) -> None:
    monkeypatch.setattr(onednn, "int8_native", lambda: True)
    target = copy.deepcopy(tiny_target)
    pair = LoadedPair(tokenizer=None, target=target, draft=DraftHead(target, HeadArch()))  # type: ignore[arg-type]
    HardwareConfig(draft_dtype="int8").place(pair)
    assert quant.precision_of(pair.draft.feature_proj) == "int8"
    assert not quantized(target)
    model = LoadedPair(tokenizer=None, target=target, draft=copy.deepcopy(tiny_target))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^hardware.draft_dtype=int8 runs a draft head, not a draft model$"):  # fmt: skip
        HardwareConfig(draft_dtype="int8").place(model)


@pytest.mark.parametrize(("fbgemm", "bf16", "int8", "auto"), AUTO_CASES)
def test_auto_drafts_a_head_in_autos_precision_and_a_model_in_bf16_where_native(
    monkeypatch, tiny_target, fbgemm, bf16, int8, auto
) -> None:
    monkeypatch.setattr(quant, "fbgemm_sums", lambda: object() if fbgemm else None)
    monkeypatch.setattr(onednn, "bf16_native", lambda: bf16)
    monkeypatch.setattr(onednn, "int8_native", lambda: int8)
    target = copy.deepcopy(tiny_target)
    pair = LoadedPair(tokenizer=None, target=target, draft=DraftHead(target, HeadArch()))  # type: ignore[arg-type]
    HardwareConfig(draft_dtype="auto").place(pair)
    proj = pair.draft.feature_proj
    assert quant.precision_of(proj) == (auto if auto == "int8" else None)
    assert proj.weight.dtype == (torch.bfloat16 if auto == "bfloat16" else torch.float32)
    assert all(p.dtype == torch.float32 for p in target.parameters()) and not quantized(target)
    pair.draft = copy.deepcopy(tiny_target)
    HardwareConfig(draft_dtype="auto").place(pair)
    assert pair.draft.decoder.layers[0].ffn.inner_proj.weight.dtype == (torch.bfloat16 if bf16 else torch.float32)  # fmt: skip


@pytest.mark.parametrize(
    ("dtype", "flags", "message"),
    [
        ("bfloat16", ["avx2", "avx512f"], "hardware.target_dtype=bfloat16: this CPU has no "
         "native bf16 (its flags: avx2 avx512f), so the target runs float32"),
        # No AVX2 (fbgemm's GEMM needs it): torch's int8 product is a scalar loop.
        ("int8", ["avx512f"], "hardware.target_dtype=int8: this CPU has no VNNI or AMX for int8 "
         "products, nor AVX2 with the native extension built (its flags: avx512f), so the "
         "target runs float32"),
    ],
)  # fmt: skip
def test_a_precision_without_native_support_runs_float32_with_a_warning(
    monkeypatch, caplog, tiny_target, dtype, flags, message
) -> None:
    monkeypatch.setattr(onednn, "bf16_native", lambda: False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)
    pair = LoadedPair(tokenizer=None, target=copy.deepcopy(tiny_target), draft=None)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="specbeam.hardware"):
        HardwareConfig(target_dtype=dtype).place(pair)
    (record,) = caplog.records
    assert record.getMessage() == message
    assert not quantized(pair.target)


def test_a_target_that_cannot_be_quantized_is_a_one_line_error(monkeypatch, tiny_target) -> None:
    monkeypatch.setattr(onednn, "int8_native", lambda: True)
    half = copy.deepcopy(tiny_target).to(torch.bfloat16)
    pair = LoadedPair(tokenizer=None, target=half, draft=None)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"^hardware.target_dtype=int8 cannot run this target: its linear layers are "
        r"torch.bfloat16: only float32 weights are quantized$",
    ):
        HardwareConfig(target_dtype="int8").place(pair)
    assert not any(isinstance(m, attention.OrderedSDPA) for m in half.modules())
    no_layers = LoadedPair(tokenizer=None, target=torch.nn.Sequential(torch.nn.ReLU()), draft=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="it has no fairseq2 linear layers to quantize$"):
        HardwareConfig(target_dtype="int8").place(no_layers)


def test_a_device_is_accepted_where_torch_sees_it(monkeypatch) -> None:
    with pytest.raises(ValueError, match="hardware.device=tpu is invalid: allowed: cpu, cuda"):
        HardwareConfig(device="tpu", threads=1).apply()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="hardware.device=cuda is invalid: torch sees no GPU"):
        HardwareConfig(device="cuda", threads=1).apply()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    HardwareConfig(device="cuda", threads=1).apply()  # accepted; placing models needs a GPU


def test_machine_settings_are_checked_with_their_names() -> None:
    with pytest.raises(ValueError, match="hardware.onednn_min_rows=0 is invalid: must be ≥ 1"):
        HardwareConfig(onednn_min_rows=0, threads=1).apply()
    with pytest.raises(ValueError, match="hardware.costs is incomplete or malformed"):
        HardwareConfig(costs={"target": [1.0, 0.1]}, threads=1).apply()


def test_tuned_gamma_bounds_widen_to_the_gamma_the_user_gives() -> None:
    """hardware=cpu tunes spec_beam's adaptive γ to [1, 4]: decoding.gamma=6 on the command
    line, or in evaluate's method string, widens them rather than failing on them."""
    hw = HardwareConfig(tuned={"spec_beam": {"gamma": 2, "gamma_bounds": [1, 4]}})
    given = hw.tune(DecodingConfig(name="spec_beam", gamma=6), keep={"gamma"})
    assert (given.gamma, given.gamma_bounds) == (6, [1, 6])
    given.validate()
    method = hw.tune(load_decoding("spec_beam:gamma=6;draft_width=8"))
    assert (method.gamma, method.draft_width, method.gamma_bounds) == (6, 8, [1, 6])
    method.validate()
    assert hw.tune(DecodingConfig(name="spec_beam")).gamma_bounds == [1, 4]


def test_gamma_bounds_the_user_gives_must_include_gamma() -> None:
    hw = HardwareConfig(tuned={"spec_beam": {"gamma_bounds": [1, 4]}})
    mine = DecodingConfig(name="spec_beam", gamma=6, gamma_bounds=(1, 5))
    kept = hw.tune(mine, keep={"gamma", "gamma_bounds"})
    with pytest.raises(ValueError, match=r"decoding.gamma_bounds=\(1, 5\) is invalid"):
        kept.validate()
