"""The `fairseq2.extension` entry point, kept light.

fairseq2 imports its extensions in every process that builds its dependency container,
and registering the speculative generators (`specbeam/integration/extension.py`) imports
fairseq2's recipe package: a one-line `python -m specbeam.translate` took 6.78 s with it
and 5.95 s without (means of five interleaved runs, AMD EPYC Zen 4, 2 cores).
specbeam's own command lines load their models by path and run no recipe, so they skip it
(`skip_generators`); every other process registers as before.
"""

from __future__ import annotations

from fairseq2.runtime.dependency import DependencyContainer

_register = True


def skip_generators() -> None:
    """For a process that runs no fairseq2 recipe (specbeam's apps): its dependency
    container, built later, will not know the speculative generators or the embedded
    tasks' asset cards. Call before fairseq2 initialises."""
    global _register
    _register = False


def register_specbeam(container: DependencyContainer) -> None:
    """fairseq2's extension function (see `specbeam.integration.extension`)."""
    if _register:
        from specbeam.integration.extension import register_specbeam as register

        register(container)
