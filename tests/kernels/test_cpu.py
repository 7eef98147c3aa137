import subprocess
import sys

from specbeam.kernels import cpu

ZEN3 = {
    "model name": "AMD EPYC",
    "cpu family": "25",
    "model": "1",
    "flags": "fpu sse2 avx f16c fma avx2 bmi2",
}
SAPPHIRE = {
    "model name": "Intel Xeon",
    "cpu family": "6",
    "model": "143",
    "flags": "avx2 avx512f avx512bw amx_int8 amx_bf16 avx512_bf16 avx512_vnni avx_vnni",
}


def test_cpu_kind_names_family_model_and_the_kernel_flags(monkeypatch) -> None:
    monkeypatch.setattr(cpu, "cpu_info", lambda field: ZEN3.get(field, ""))
    assert cpu.cpu_kind() == "AMD EPYC family 25 model 1, avx2"
    monkeypatch.setattr(cpu, "cpu_info", lambda field: SAPPHIRE.get(field, ""))
    assert cpu.cpu_kind() == (
        "Intel Xeon family 6 model 143, avx2, avx512f, avx512_vnni, avx512_bf16, avx_vnni, "
        "amx_bf16, amx_int8"
    )


def test_a_machine_without_cpuinfo_is_named_unknown(monkeypatch) -> None:
    monkeypatch.setattr(cpu, "cpu_info", lambda field: "")
    assert cpu.cpu_kind() == "unknown CPU family ? model ?, no AVX2"


def test_cpu_info_reads_this_machine() -> None:
    assert cpu.cpu_info("flags") and cpu.cpu_info("no such field") == ""


def test_importing_it_loads_no_torch() -> None:
    """CTranslate2's engine processes name the CPU and must not carry torch."""
    code = "import sys, specbeam.kernels.cpu; print('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
