"""A command line's start-up: work it defers, the output unchanged.

`begin` runs first thing in the entry module (`specbeam/translate.py`), before torch and
fairseq2 are imported; `done` when the pipeline is built (`PipelineConfig.build`).

Python's garbage collector waits until `done`: importing torch, fairseq2 and transformers
and loading the models allocate millions of objects, few of them garbage, and every full
collection walks all of them. `done` freezes what exists then (the modules, the models), so
that the collections of the run skip it too.
"""

from __future__ import annotations

import gc

_begun = False


def begin() -> None:
    """Call before the imports (`python -m specbeam.translate`)."""
    global _begun
    if not _begun:
        _begun = True
        gc.disable()


def done() -> None:
    """The process's long-lived objects exist: collect garbage from now on, not them.
    Does nothing in a process that did not `begin` (a library user's)."""
    global _begun
    if _begun:
        _begun = False
        gc.freeze()
        gc.enable()
