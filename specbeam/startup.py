"""A command line's start-up: work it defers, the output unchanged.

`begin` runs first thing in the entry module (`specbeam/translate.py`), before torch and
fairseq2 are imported; `done` when the pipeline is built (`PipelineConfig.build`).

Python's garbage collector waits until `done`: importing torch, fairseq2 and transformers
and loading the models allocate millions of objects, few of them garbage, and every full
collection walks all of them. `done` freezes what exists then (the modules, the models), so
that the collections of the run skip it too.

Ctrl-C before `done` (the imports, composing the config, loading the models) ends the
process with one line, `interrupted`, and the shell's code for it (130), not a traceback;
from `done` on, an app handles it (translate says how far its output got).
"""

from __future__ import annotations

import gc
import signal
import sys
from types import FrameType
from typing import NoReturn

_begun = False


def begin() -> None:
    """Call before the imports (`python -m specbeam.translate`)."""
    global _begun
    if not _begun:
        _begun = True
        gc.disable()
        signal.signal(signal.SIGINT, _on_interrupt)


def done() -> None:
    """The process's long-lived objects exist: collect garbage from now on, not them.
    Does nothing in a process that did not `begin` (a library user's)."""
    global _begun
    if _begun:
        _begun = False
        gc.freeze()
        gc.enable()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupted() -> NoReturn:
    """Ends the process as Ctrl-C should: one line, exit code 130 (128 + SIGINT)."""
    print("interrupted", file=sys.stderr)
    raise SystemExit(130)


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    interrupted()
