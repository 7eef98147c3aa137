import pytest
import torch

from specbeam.apps.hardware import HardwareConfig, load_hardware
from specbeam.search import onednn


@pytest.mark.parametrize("native", [True, False])
def test_auto_draft_dtype_is_bfloat16_only_where_the_cpu_computes_it(monkeypatch, native) -> None:
    monkeypatch.setattr(onednn, "bf16_native", lambda: native)
    expected = torch.bfloat16 if native else torch.float32
    assert HardwareConfig(draft_dtype="auto").draft_torch_dtype == expected
    assert HardwareConfig(draft_dtype="float32").draft_torch_dtype == torch.float32
    assert HardwareConfig(draft_dtype="bfloat16").draft_torch_dtype == torch.bfloat16


def test_cpu_config_chooses_the_draft_dtype_by_the_cpu() -> None:
    assert load_hardware("cpu").draft_dtype == "auto"


def test_unknown_dtype_names_the_setting_and_what_is_allowed() -> None:
    with pytest.raises(
        ValueError, match="hardware.draft_dtype=fp8 is invalid: allowed: float32, bfloat16, auto"
    ):
        HardwareConfig(draft_dtype="fp8").apply()
    with pytest.raises(
        ValueError, match="hardware.target_dtype=auto is invalid: allowed: float32, bfloat16$"
    ):
        HardwareConfig(target_dtype="auto").apply()
