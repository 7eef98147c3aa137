"""A command line's start-up: work it defers, the output unchanged.

`begin` runs first thing in the entry modules (`specbeam/translate.py` and the other apps'),
before torch and fairseq2 are imported; `done` when the pipeline is built
(`PipelineConfig.build`).

In translate, Python's garbage collector waits until `done`: importing torch, fairseq2 and
transformers and loading the models allocate millions of objects, few of them garbage, and
every full collection walks all of them. `done` freezes what exists then (the modules, the
models), so that the collections of the run skip it too.

Ctrl-C before `done` (the imports, composing the config, loading the models) ends the
process with one line, `interrupted`, and the shell's code for it (130), not a traceback;
from `done` on, an app handles it (translate says how far its output got). SIGTERM, what a
batch scheduler's time limit, `docker stop` and systemd send, is handled as Ctrl-C is
(`Terminated`, a `KeyboardInterrupt`), with the shell's code for it (143).
"""

from __future__ import annotations

import gc
import signal
import sys
from types import FrameType
from typing import NoReturn

_begun = False
_holding = False  # the garbage collector, until `done`


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so that every handler of an
    interrupt (finished lines kept, checkpoints left whole) handles it too."""


def exit_code(stop: KeyboardInterrupt) -> int:
    """The shell's code for the signal that stopped the process: 128 + its number."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def stopped(stop: KeyboardInterrupt) -> str:
    """What the process says it was: `interrupted` (SIGINT) or `terminated` (SIGTERM)."""
    return "terminated" if isinstance(stop, Terminated) else "interrupted"


def begin(hold_gc: bool = True) -> None:
    """Call before the imports (`python -m specbeam.translate`). `hold_gc=False` for an
    app that may never build a pipeline (evaluate, training), whose collections must not
    wait for `done`: it gets the one-line Ctrl-C alone."""
    global _begun, _holding
    if not _begun:
        _begun, _holding = True, hold_gc
        if hold_gc:
            gc.disable()
        signal.signal(signal.SIGINT, _on_interrupt)
        signal.signal(signal.SIGTERM, _on_interrupt)


def done() -> None:
    """The process's long-lived objects exist: collect garbage from now on, not them.
    Does nothing in a process that did not `begin` (a library user's)."""
    global _begun
    if _begun:
        _begun = False
        if _holding:
            gc.freeze()
            gc.enable()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise_terminated)


def interrupted(stop: KeyboardInterrupt | None = None) -> NoReturn:
    """Ends the process as Ctrl-C (or SIGTERM: `stop`) should: one line, the shell's exit
    code for the signal."""
    stop = stop or KeyboardInterrupt()
    print(stopped(stop), file=sys.stderr)
    raise SystemExit(exit_code(stop))


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    interrupted(Terminated() if signum == signal.SIGTERM else None)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated
