"""The compiled extension's loader: the lean decoder's layer loop (`csrc/lean_layers.cpp`), its attention
(`csrc/attention.cpp`), few-row products (`csrc/few_rows.cpp`), int8 sums on fbgemm
(`csrc/int8_sums.cpp`), exact acceptance's replay and its candidates (`csrc/accept.cpp`,
`csrc/top.cpp`), the cache's commit (`csrc/cache.cpp`), the slot table (`csrc/slots.cpp`)
and a call's embedded slots (`csrc/embed.cpp`) compiled, where a C++ compiler is at hand.

Each small op of a decoder call (norms, views, residual adds, attention's transposes,
cache writes: ~30 per layer) costs several times its back-to-back time in Python,
because every product before it streamed weights through the CPU's caches and evicted the
interpreter's working set. The same ATen ops called from C++ skip the interpreter and
give bit-identical logits; the step time this saves is in docs/bench.md.

The extension is built by torch's `cpp_extension` on first use (about two minutes on 2
cores, in `~/.cache/specbeam/native/<hash of sources, torch and Python>` or
`$SPECBEAM_NATIVE_DIR`);
`scripts/setup.sh` builds it (`python -m specbeam.build_native`). Where it cannot be
built the decoder runs its layers, and acceptance its replay, in Python, and the log says
why; so do calls whose tensors are not on the CPU (`module_for`). `hardware.native=false`
switches it off.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from specbeam.kernels.runtime import Runtime

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
NAMES = "module lean_layers attention few_rows int8_sums accept top cache slots embed"
SOURCES = [CSRC / f"{name}.cpp" for name in NAMES.split()]
HEADERS = [CSRC / name for name in ("native.h", "vec.h")]


NAME = "specbeam_native"
FLAGS = ["-O2", "-ffp-contract=off", "-fopenmp"]
"""No product fused with the add after it: the C++ rounds as ATen's op-by-op kernels do.
OpenMP: ATen's `parallel_for` is a header whose loop runs on one thread unless the
caller is compiled with it (it then shares torch's OpenMP runtime and thread count)."""
LINK_FLAGS = ["-fopenmp"]


def build_dir() -> Path:
    """Where the extension is built: one directory per set of sources (headers included),
    flags, torch and Python version, so that a cached build is never stale."""
    key = hashlib.sha256(
        b"".join(path.read_bytes() for path in SOURCES + HEADERS)
        + f"{torch.__version__} {sys.version} {FLAGS} {LINK_FLAGS}".encode()
    ).hexdigest()[:16]
    root = os.environ.get("SPECBEAM_NATIVE_DIR") or Path.home() / ".cache" / "specbeam" / "native"
    return Path(root) / key


@functools.cache
def build() -> ModuleType | None:
    """The compiled extension, built if it is not yet; None where it cannot be. A built
    one is imported directly: torch's `load` would check the build again, a start-up cost
    in every process (docs/bench.md)."""
    where = build_dir()
    built = where / f"{NAME}.so"
    try:
        if not built.exists():
            from torch.utils.cpp_extension import load

            where.mkdir(parents=True, exist_ok=True)
            log.info("building the native layers once (about two minutes on 2 cores) in %s", where)
            return load(
                NAME,
                [str(s) for s in SOURCES],
                extra_cflags=FLAGS,
                extra_ldflags=LINK_FLAGS,
                build_directory=str(where),
            )
        loader = importlib.machinery.ExtensionFileLoader(NAME, str(built))
        spec = importlib.util.spec_from_file_location(NAME, built, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    except Exception as error:  # no compiler, no headers, a failed build: all the same here
        text = str(error).strip()
        log.warning(
            "the lean decoder's native layers could not be built, so they run in Python: %s",
            text.splitlines()[-1] if text else type(error).__name__,
        )
        return None


def module() -> ModuleType | None:
    """The extension, where the current runtime uses it (`Runtime.native`)."""
    return build() if Runtime.current().native else None


def module_for(x: Tensor) -> ModuleType | None:
    """The extension where `x` (any tensor of the call) is on the CPU, the only device its
    kernels run on; None elsewhere, and the caller runs its portable torch path."""
    return module() if x.device.type == "cpu" else None


def main() -> None:
    """`python -m specbeam.build_native` (scripts/setup.sh): builds the extension once, so
    that no app waits for it."""
    parser = argparse.ArgumentParser(
        prog="python -m specbeam.build_native",
        description="Builds the lean decoders' native layers once (C++ and OpenMP, about two "
        f"minutes on 2 cores), in $SPECBEAM_NATIVE_DIR or {build_dir().parent}, so that no "
        "app waits for them; an app builds them itself where they are missing.",
    )
    parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    began = time.perf_counter()
    if build() is None:
        raise SystemExit(1)
    print(f"native layers: ready in {time.perf_counter() - began:.1f} s")
