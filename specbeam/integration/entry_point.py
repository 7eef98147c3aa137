"""The `fairseq2.extension` entry point, kept light.

fairseq2 imports its extensions in every process that builds its dependency container.
Every such process gets the embedded tasks' asset cards (`tasks/*/cards/`) and the
`transformer` model family (`specbeam/integration/transformer.py`), which cost nothing
to register. Registering the speculative generators (`specbeam/integration/extension.py`)
imports fairseq2's recipe package, about 0.8 s of a process's start-up: specbeam's own
command lines run no recipe, so they skip it (`skip_generators`).
"""

from __future__ import annotations

from fairseq2.composition import register_file_assets
from fairseq2.runtime.dependency import DependencyContainer

from specbeam.integration.transformer import register_transformer_family
from specbeam.paths import SHIPPED

_register = True


def skip_generators() -> None:
    """For a process that runs no fairseq2 recipe (specbeam's apps): its dependency
    container, built later, will not know the speculative generators. Call before
    fairseq2 initialises."""
    global _register
    _register = False


def register_specbeam(container: DependencyContainer) -> None:
    """fairseq2's extension function (see `specbeam.integration.extension`)."""
    for cards in sorted((SHIPPED / "tasks").glob("*/cards")):
        register_file_assets(container, cards, not_exist_ok=True)
    register_transformer_family(container)
    if _register:
        from specbeam.integration.extension import register_specbeam as register

        register(container)
