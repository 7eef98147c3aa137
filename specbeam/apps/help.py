"""An app's --help: its config groups and its own settings, each with its value (as a run
uses it: a calibration's tuned decoding settings too) and a description, the first sentence
of the docstring under the setting's field in the app's config dataclasses (Hydra's help
would list every group under conf/, the training `arch` too, with no descriptions)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from collections.abc import Sequence
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict

from specbeam.paths import SHIPPED, config_choices, user_config_dir

_WIDTH = 38  # of the SETTING=VALUE column
_LINE = 120


def app_help(app: str, doc: str | None, overrides: Sequence[str]) -> str:
    """`python -m specbeam.<app> --help`, the config composed with the command line's
    other overrides."""
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None, job_name=app):
        cfg = compose(app, overrides=list(overrides), return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    tuned = show_tuned(cfg, overrides)
    intro = (doc or "").strip().split("\n\n")[0]
    lines = [
        intro,
        "",
        f"python -m specbeam.{app} [SETTING=VALUE ...]",
        "  (--cfg job prints the whole config; --hydra-help lists Hydra's own flags)",
        "",
    ]
    # Groups of the app's defaults list only: another app's group (train_head's task, a
    # dataclass default) cannot be picked with GROUP=NAME.
    groups = [str(g) for g in cfg if str(g) in choices and (SHIPPED / "conf" / str(g)).is_dir()]
    if groups:
        lines.append(
            "Config groups (GROUP=NAME picks conf/GROUP/NAME.yaml; * marks the one in use):"
        )
    for group in groups:
        names = config_choices(group, [SHIPPED / "conf", user_config_dir()])
        marked = [f"{n}*" if n == choices[group] else n for n in names]
        lines.append(f"  {group}: {', '.join(marked)}")
    if "hardware" in groups:
        lines.append(
            f"  (also found in {user_config_dir()}/GROUP/, where calibrate writes hardware configs)"
        )
    lines += [
        *([""] if groups else []),
        "Settings (SETTING=VALUE):",
        *settings(cfg, tuned=tuned),
    ]
    return "\n".join(lines)


def show_tuned(cfg: DictConfig, overrides: Sequence[str]) -> dict[str, str]:
    """Writes into `cfg` the decoding settings the hardware config's calibration replaces
    (`HardwareConfig.tune`: what a run uses, unless the command line sets them); returns
    each one's name (`decoding.gamma`) -> where it comes from."""
    if "decoding" not in cfg or "hardware" not in cfg:
        return {}
    given = group_settings(overrides, "decoding")
    try:
        decoding, hardware = OmegaConf.to_object(cfg.decoding), OmegaConf.to_object(cfg.hardware)
        tuned = hardware.tune(decoding, given)  # type: ignore[union-attr]
    except ValueError:  # a bad hardware setting or calibration: the run will say so
        return {}
    changed = {
        f.name: getattr(tuned, f.name)
        for f in dataclasses.fields(tuned)
        if getattr(tuned, f.name) != getattr(decoding, f.name)
    }
    for name, value in changed.items():
        cfg.decoding[name] = list(value) if isinstance(value, tuple) else value
    return {f"decoding.{name}": f"hardware={hardware.name}'s calibration" for name in changed}  # type: ignore[union-attr]


def group_settings(overrides: Sequence[str], group: str) -> set[str]:
    """Settings of a config group that command-line overrides set (`decoding.gamma=6` ->
    {"gamma"})."""
    names = (o.split("=", 1)[0].lstrip("+~") for o in overrides)
    return {n.split(".", 1)[1] for n in names if n.startswith(f"{group}.")}


def settings(node: DictConfig, prefix: str = "", tuned: dict[str, str] | None = None) -> list[str]:
    """A line per setting of a structured config node (its description wrapped over more
    lines where long): its own first, then those of its nested dataclasses (the config
    groups'). `tuned`: settings a calibration set, and which (`show_tuned`)."""
    tuned = tuned or {}
    kind = OmegaConf.get_type(node)
    described = descriptions(kind) if isinstance(kind, type) else {}
    values = OmegaConf.to_container(node, resolve=False)
    assert isinstance(values, dict)
    lines, nested = [], []
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            nested += settings(child, f"{prefix}{key}.", tuned)
            continue
        setting = f"  {prefix}{key}={_value(values[key])}"
        description = described.get(str(key), "")
        if f"{prefix}{key}" in tuned:
            description = f"[{tuned[f'{prefix}{key}']}] {description}"
        indent = max(_WIDTH, len(setting) + 2)
        wrapped = textwrap.wrap(description, _LINE - indent) or [""]
        lines.append(f"{setting}{' ' * (indent - len(setting))}{wrapped[0]}".rstrip())
        lines += [" " * indent + more for more in wrapped[1:]]
    return lines + nested


def _value(value: Any) -> str:
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value).replace(", ", ",")
    return text if len(text) <= 24 else f"{text[:23]}…"


def descriptions(kind: type) -> dict[str, str]:
    """Field name -> the first sentence of the docstring under the field, over the
    dataclass and its bases."""
    found: dict[str, str] = {}
    for cls in reversed(kind.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for field, after in zip(body, body[1:], strict=False):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[field.target.id] = first_sentence(after.value.value)
    return found


def first_sentence(doc: str) -> str:
    text = " ".join(doc.split()).replace("e.g. ", "e.g.\0").replace("i.e. ", "i.e.\0")
    end = text.find(". ")
    return (text if end < 0 else text[: end + 1]).replace("\0", " ")
