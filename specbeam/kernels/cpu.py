"""What this CPU is, from /proc/cpuinfo: which kernels run fast, and its name in benchmarks.

Imports no torch, so that a benchmark's engine processes (`scripts/bench_ctranslate2.py`)
can name the CPU without loading it."""

from __future__ import annotations

import functools

_KERNEL_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_bf16",
    "amx_int8",
)
"""The flags that decide which products run fast: fp32 width, int8 dot products, bf16."""


def cpu_info(field: str) -> str:
    """A field of the first CPU in /proc/cpuinfo (`vendor_id`, `flags`); empty where
    there is none."""
    line = next((x for x in _cpuinfo().splitlines() if x.split(":")[0].strip() == field), "")
    return line.partition(":")[2].strip()


@functools.cache
def _cpuinfo() -> str:
    """The first CPU's lines of /proc/cpuinfo, read once: the precision and kernel choices
    ask for its flags once per weight (a read costs tens of microseconds)."""
    try:
        with open("/proc/cpuinfo") as info:
            return info.read().split("\n\n", 1)[0]
    except OSError:
        return ""


def cpu_flags() -> list[str]:
    """The CPU's flags among those that decide how fast each precision runs."""
    flags = cpu_info("flags").split()
    return [f for f in _KERNEL_FLAGS if f in flags]


def cpu_kind() -> str:
    """The CPU as benchmarks name it beside their figures: model name, family, model and
    kernel flags (`AMD EPYC family 25 model 1, avx2`). Virtual machines often report a bare
    model name, which alone does not tell Zen 3 from Zen 4."""
    name = cpu_info("model name") or "unknown CPU"
    family, model = cpu_info("cpu family") or "?", cpu_info("model") or "?"
    return f"{name} family {family} model {model}, {', '.join(cpu_flags()) or 'no AVX2'}"
