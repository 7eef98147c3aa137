"""Where specbeam's shipped files are, and how the paths of a setting resolve.

The shipped files are the Hydra configs (`conf/`) and the embedded task's files
(`tasks/bible_es_en/`: cards, models, tokenizer, data). An installed wheel keeps them in
the package directory (`site-packages/specbeam/conf`, `.../specbeam/tasks`); a checkout
keeps them at the top of the repository. A path a user gives resolves against the working
directory; a shipped config names its own files as `${specbeam:tasks/...}`, which resolves
against the shipped files' home, wherever the package is.
"""

import os
from collections.abc import Iterable
from pathlib import Path

from omegaconf import OmegaConf


def _home() -> Path:
    package = Path(__file__).resolve().parent
    return package if (package / "conf").is_dir() else package.parent


SHIPPED = _home()
"""The directory holding `conf/` and `tasks/`."""


def shipped(relative: str) -> Path:
    """A shipped file or directory, e.g. `tasks/bible_es_en/models/target.pt`."""
    return SHIPPED / relative


def user_config_dir() -> Path:
    """The user's own configs, in the shipped ones' layout (`hardware/NAME.yaml`):
    `$XDG_CONFIG_HOME/specbeam`, by default `~/.config/specbeam`. calibrate writes there,
    and every app's search path has it, so nothing is written into the package."""
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "specbeam"


def user_path(spec: str) -> Path:
    """A path a user gave: relative to the working directory unless absolute (`~` expanded)."""
    path = Path(spec).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def config_choices(group: str, conf_dirs: Iterable[Path]) -> list[str]:
    """The names a config group offers in these config directories (`<dir>/<group>/*.yaml`)."""
    return sorted({p.stem for d in conf_dirs for p in (d / group).glob("*.yaml")})


def config_file(group: str, name: str) -> Path:
    """`conf/<group>/<name>.yaml`; a ValueError naming the ones there if it is not."""
    path = SHIPPED / "conf" / group / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(config_choices(group, [SHIPPED / "conf"]))
        raise ValueError(f"{group}={name} is unknown; allowed: {known}")
    return path


# Registered on import, so every config specbeam composes or loads can use it.
OmegaConf.register_new_resolver("specbeam", lambda relative: str(shipped(relative)), replace=True)
# `${specbeam.user_dir:${output_dir},DEFAULT}`: an app's Hydra run directory inside the
# directory the user gave (Hydra expands no `~`), else DEFAULT.
OmegaConf.register_new_resolver(
    "specbeam.user_dir",
    lambda path, default: str(user_path(path)) if path else default,
    replace=True,
)
