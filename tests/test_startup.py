"""A command line's start-up: `python -m specbeam.translate` holds garbage collection until
its pipeline is built, which needs `import specbeam` to import nothing heavy."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

import specbeam
from specbeam import startup

REPO = Path(__file__).resolve().parents[1]

# Runs the real entry module, then reports the collector's state as the process ends.
_ENTRY = """
import atexit, gc, runpy, sys
atexit.register(lambda: print("gc", gc.isenabled(), gc.get_freeze_count(), file=sys.stderr))
sys.argv = ["translate", *sys.argv[1:]]
runpy.run_module("specbeam.translate", run_name="__main__")
"""


def test_importing_the_package_imports_neither_torch_nor_fairseq2() -> None:
    """The entry module's `startup.begin()` must run before these imports."""
    code = "import sys, specbeam.startup; print(sorted({'torch', 'fairseq2', 'hydra'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_package_still_exports_its_names() -> None:
    from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator

    assert specbeam.SpeculativeBeamSearchSeq2SeqGenerator is SpeculativeBeamSearchSeq2SeqGenerator
    for name in specbeam.__all__:
        assert getattr(specbeam, name).__name__ == name
    assert set(specbeam.__all__) <= set(dir(specbeam))
    with pytest.raises(AttributeError):
        specbeam.nothing_of_that_name  # noqa: B018


def test_translate_collects_again_once_built_and_skips_what_start_up_made(tmp_path) -> None:
    cmd = [sys.executable, "-c", _ENTRY, "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", f"hydra.run.dir={tmp_path}"]  # fmt: skip
    result = subprocess.run(
        cmd, cwd=REPO, input="Hola\n", capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    enabled, frozen = result.stderr.strip().splitlines()[-1].split()[1:]
    assert enabled == "True"
    assert int(frozen) > 100_000  # torch's, fairseq2's and the models' objects


def test_done_without_begin_leaves_a_library_user_s_collector_alone() -> None:
    gc.disable()
    try:
        startup.done()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_sigterm_is_an_interrupt_with_its_own_word_and_exit_code() -> None:
    """Every handler of Ctrl-C handles SIGTERM too (a scheduler's time limit); the shell
    tells them apart by the exit code, 128 + the signal's number."""
    assert issubclass(startup.Terminated, KeyboardInterrupt)
    assert (startup.stopped(KeyboardInterrupt()), startup.exit_code(KeyboardInterrupt())) == (
        "interrupted",
        130,
    )
    assert (startup.stopped(startup.Terminated()), startup.exit_code(startup.Terminated())) == (
        "terminated",
        143,
    )
