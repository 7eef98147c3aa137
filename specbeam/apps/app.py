"""What specbeam's Hydra apps share: the settings of a translation pipeline, building it,
and turning bad settings into one-line errors."""

from __future__ import annotations

import dataclasses
import difflib
import os
import shutil
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, final

from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.errors import HydraException
from hydra.plugins.config_source import ConfigLoadError
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError
from omegaconf.nodes import BooleanNode, FloatNode, IntegerNode
from typing_extensions import override

from specbeam import startup
from specbeam.apps.decoding import SAMPLING, DecodingConfig, build_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.apps.help import app_help, group_settings
from specbeam.data.task import TaskConfig
from specbeam.integration import entry_point
from specbeam.integration.models import ModelPairConfig, open_pair
from specbeam.paths import SHIPPED, config_choices, user_config_dir
from specbeam.search.config import SpeculativeSearchConfig

R = TypeVar("R")


@dataclass(kw_only=True)
class PipelineConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)

    def settle(self) -> SpeculativeSearchConfig:
        """The decoding as this machine runs it (`HardwareConfig.tune`, into `decoding`)
        and its search config, checked once per run (`DecodingConfig.search_config`; the
        hardware was checked as it was read); `run_app` settles before the app's own
        checks, which compare with it (translate's nbest ≤ beam_size). Values tuning
        replaces are checked as given too: a bad one is an error even where the
        machine's tuned value would replace it."""
        settled: SpeculativeSearchConfig | None = getattr(self, "search_config", None)
        if settled is not None:
            return settled
        given = command_line_settings("decoding")
        if warning := unused_warning(self.decoding, given):
            print(f"warning: {warning}", file=sys.stderr)
        tuned = self.hardware.tune(self.decoding, given)
        if tuned != self.decoding:
            self.decoding.search_config(self.hardware)
        self.search_config = tuned.search_config(self.hardware)
        self.decoding = tuned
        return self.search_config

    def build(self) -> tuple[Tokenizer, Seq2SeqGenerator]:
        """A non-speculative decoding leaves the pair's draft unloaded rather than
        refusing it: the draft belongs to the model pair, which every decoding shares
        (the default pair has one, and `decoding=beam` runs on it)."""
        config = self.settle()
        self.hardware.apply()
        if self.decoding.speculative and self.model.draft is None:
            raise ValueError(
                f"decoding={self.decoding.name} is speculative but model.draft is none: "
                "set model.draft, or use a non-speculative decoding (beam, greedy)"
            )
        pair = self.hardware.place(open_pair(
            self.model, self.task.src_lang, self.task.tgt_lang,
            with_draft=self.decoding.speculative, draft_dtype=self.hardware.draft_torch_dtype,
        ))  # fmt: skip
        vocab = pair.tokenizer.vocab_info
        generator = build_generator(config, pair.target, pair.draft, vocab)
        startup.done()
        return pair.tokenizer, generator


def unused_warning(decoding: DecodingConfig, given: Collection[str]) -> str | None:
    """A line naming the decoding settings given on the command line that `decoding` never
    reads (`decoding=beam decoding.gamma=3`), which would otherwise pass silently."""
    unused = decoding.unused(given)
    if not unused:
        return None
    named = ", ".join(f"decoding.{name}={getattr(decoding, name)}" for name in unused)
    kinds = [
        kind
        for kind, sampling in (("speculate", False), ("sample", True))
        if any((name in SAMPLING) == sampling for name in unused)
    ]
    verb = "has" if len(unused) == 1 else "have"
    return f"{named} {verb} no effect: decoding={decoding.name} does not {' or '.join(kinds)}"


def command_line_settings(group: str) -> set[str]:
    """Settings of a config group given on this Hydra app's command line
    (`decoding.gamma=6` -> {"gamma"}); empty outside a Hydra app."""
    if not HydraConfig.initialized():
        return set()
    return group_settings(HydraConfig.get().overrides.task, group)


def parse_shard(shard: str) -> tuple[int, int]:
    """`i/n` -> (i, n), for jobs split across processes or machines."""
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise ValueError(f"shard={shard} is invalid: expected i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"shard={shard} is invalid: need 0 ≤ i < n")
    return i, n


def shard_range(shard: str, total: int) -> tuple[int, int]:
    """The contiguous block [begin, end) of `total` lines that shard i of n owns, so
    that concatenating the shards' outputs in order restores the whole."""
    i, n = parse_shard(shard)
    return total * i // n, total * (i + 1) // n


def shard_path(path: str, shard: str) -> str:
    """Where shard i of n (n > 1) writes `path`: `path.shard-i-of-n`, so that one command
    line swept over shards (`shard=0/2,1/2`) writes distinct, valid file names, which
    `python -m specbeam.merge_shards` finds; stdout (-) stays stdout."""
    i, n = parse_shard(shard)
    return path if path == "-" or n == 1 else f"{path}.shard-{i}-of-{n}"


def run_app(app: Callable[[Any], R], cfg: DictConfig) -> R:
    """Runs an app on its structured config; a bad setting or a missing file ends the
    process with one line naming the problem, not a traceback, and so does Ctrl-C.
    Paths given on the command line are relative to the directory the command ran in,
    also where `hydra.job.chdir=true` moved the job into its run directory (which still
    gets Hydra's own files: config, log)."""
    if HydraConfig.initialized():
        os.chdir(HydraConfig.get().runtime.cwd)
    try:
        check_known(cfg)
        config = OmegaConf.to_object(cfg)
        if isinstance(config, PipelineConfig):
            config.settle()
        return app(config)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    except KeyboardInterrupt as stop:
        startup.interrupted(stop)


def check_known(node: DictConfig, prefix: str = "") -> None:
    """A ValueError for a key the schema does not know (`+decoding.gama=3`): Hydra adds
    such keys, and the dataclasses would drop them silently."""
    known = settings_of(node)
    for key in node if known is not None else ():
        if key not in known:
            raise ValueError(not_a_setting(prefix, str(key), known))
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            check_known(child, f"{prefix}{key}.")


def settings_of(node: object) -> list[str] | None:
    """The setting names of a structured config node; None where any key goes (a dict
    setting such as hardware.tuned, or a value)."""
    kind = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if kind is None or not dataclasses.is_dataclass(kind):
        return None
    return [f.name for f in dataclasses.fields(kind)]


def not_a_setting(prefix: str, key: str, known: Sequence[str]) -> str:
    near = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {prefix}{near[0]}?" if near else "--help lists the settings"
    return f"{prefix}{key} is not a setting ({hint})"


def before_hydra(argv: Sequence[str], app: str, doc: str | None) -> None:
    """What an app's command line does before Hydra runs it: --help shows the app's own
    settings, group choices and setting names are checked (Hydra would print six lines for
    a typo), and fairseq2 will not register the generators for recipes, which these
    processes do not run (0.8 s of start-up, `specbeam/integration/entry_point.py`).
    `app`: the primary config's name (its schema is `<app>_schema`); `doc`: the text
    --help begins with. fairseq2's progress bar for loading a model ends with a newline
    even where it drew nothing, so it is off where stderr is not a terminal (stderr would
    start with a blank line)."""
    if not sys.stderr.isatty():
        os.environ.setdefault("FAIRSEQ2_NO_PROGRESS", "1")
    check_override_syntax(argv)
    check_group_choices(argv)
    check_override_keys(argv, app)
    check_launcher(argv)
    for warning in shadowed_user_configs():
        print(f"warning: {warning}", file=sys.stderr)
    if {"--help", "-h"} & set(argv):
        overrides = [a for a in argv if "=" in a and not a.startswith("-")]
        print(app_help(app, doc, overrides))
        raise SystemExit(0)
    entry_point.skip_generators()


def check_override_syntax(argv: Sequence[str]) -> None:
    """Ends the process with one line where Hydra's grammar would refuse a value in a few
    lines that name neither the setting nor the remedy (a file name with brackets or
    accents: `input=traducción (1).es`), or where a comma outside brackets would ask for a
    sweep without -m: quoting the value reads it as it is."""
    parser = OverridesParser.create()
    multirun = bool({"-m", "--multirun"} & set(argv))
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or arg.startswith("-"):
            continue
        quoted = f"\"{key}='{value}'\""
        try:
            parsed = parser.parse_override(arg)
        except HydraException as error:
            raise SystemExit(
                f"error: cannot read {arg} ({str(error).splitlines()[0]}): a value with "
                f"brackets, braces, '=', ':', ',' or non-ASCII letters must be quoted: {quoted}"
            ) from None
        if parsed.is_sweep_override() and not multirun:
            raise SystemExit(
                f"error: {arg} gives {key} several values (the comma): add -m to run one job "
                f"per value, or quote the value to read it as it is: {quoted}"
            )


def check_override_keys(argv: Sequence[str], app: str) -> None:
    """Ends the process with one line when an override names no setting of the app's
    schema (`decoding.gama=3`, `+ouput=x`), with the nearest name that is one."""
    try:
        schema = ConfigStore.instance().load(f"{app}_schema.yaml").node
    except ConfigLoadError:
        return
    for arg in argv:
        key, sep, value = arg.partition("=")
        parts = key.lstrip("+~").split(".")
        if not sep or arg.startswith("-") or parts[0] == "hydra" or "/" in key or "@" in key:
            continue  # a flag, Hydra's own settings, a group path (hydra/launcher=…), a package
        node: Any = schema
        for depth, part in enumerate(parts):
            known = settings_of(node)
            if known is None:
                break
            if part not in known:
                if depth == 0 and len(parts) > 1 and parts[-1] in known:
                    # `hardware.threads=1` to an app whose own setting is `threads`
                    raise SystemExit(
                        f"error: {key.lstrip('+~')} is not a setting (did you mean {parts[-1]}?)"
                    )
                prefix = "".join(f"{p}." for p in parts[:depth])
                raise SystemExit(f"error: {not_a_setting(prefix, part, known)}")
            node = node._get_node(part)
        else:
            if (problem := value_problem(node, value)) is not None:
                raise SystemExit(f"error: {key.lstrip('+~')}={value} is invalid: {problem}")


_KINDS = {IntegerNode: "an integer", FloatNode: "a number", BooleanNode: "true or false"}


def value_problem(node: object, value: str) -> str | None:
    """Why a command-line value does not fit a number or switch setting (Hydra would print
    six lines advising HYDRA_FULL_ERROR); None where it fits or is not such a setting (a
    null, an interpolation, a sweep: Hydra's to parse)."""
    kind = next((k for k in _KINDS if isinstance(node, k)), None)
    if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]  # Hydra's quotes make a string, which the setting converts
    if kind is None or value in ("null", "") or any(c in value for c in "${},()"):
        return None
    try:
        kind(value=value)
    except ValidationError:
        return f"must be {_KINDS[kind]}"
    return None


def check_launcher(argv: Sequence[str]) -> None:
    """A multirun on the SLURM launcher where SLURM is not: one line, not submitit's
    traceback after the config is composed. A sweep over the thread count there: submitit
    asks the same CPUs for every job of a sweep, those of the config before the sweep's
    values (`conf/hydra/launcher/slurm.yaml`), so a job with more threads would share them."""
    multirun = {"-m", "--multirun"} & set(argv) and not {"--cfg", "-c"} & set(argv)
    if not multirun or "hydra/launcher=slurm" not in argv:
        return
    if shutil.which("sbatch") is None:
        raise SystemExit(
            "error: hydra/launcher=slurm submits jobs with SLURM's sbatch, which is not on "
            "PATH here (hydra/launcher=joblib runs the sweep on this machine)"
        )
    if any(a.startswith("hydra.launcher.cpus_per_task=") for a in argv):
        return
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") in ("hardware.threads", "threads") and _swept(value):
            raise SystemExit(
                f"error: {arg} sweeps the thread count on SLURM, but submitit gives every job "
                "of a sweep the same CPUs (those of the unswept config): submit one sweep per "
                "thread count, or give every job the most with hydra.launcher.cpus_per_task=N"
            )


def _swept(value: str) -> bool:
    """Whether an override's value is a sweep (Hydra's a,b or range/choice/glob)."""
    return "," in value or value.startswith(("range(", "choice(", "glob("))


def check_group_choices(argv: Sequence[str], conf_dir: Path = SHIPPED / "conf") -> None:
    """Ends the process with one line when an override picks a config that does not
    exist (`decoding=nope`), naming the ones that do and where it looked; Hydra would
    print a dozen lines. The per-user directory (`paths.user_config_dir`) and those of
    `hydra.searchpath=[file://DIR,…]` count too."""
    dirs = [conf_dir, user_config_dir(), *searchpath_dirs(argv)]
    for arg in argv:
        group, sep, value = arg.partition("=")
        if not sep or not group.isidentifier() or not (conf_dir / group).is_dir():
            continue
        allowed = config_choices(group, dirs)
        for choice in value.split(","):  # a multirun sweeps over several
            if choice not in allowed and "(" not in choice:
                looked = ", ".join(str(d / group) for d in dirs)
                raise SystemExit(
                    f"error: {group}={choice} is unknown; allowed: {', '.join(allowed)} "
                    f"(looked in {looked})"
                )


def shadowed_user_configs(conf_dir: Path = SHIPPED / "conf") -> list[str]:
    """One line per user config that a shipped one of the same name hides: the shipped
    configs come first on the search path, so `hardware=cpu` keeps meaning the shipped
    one, and a user's `hardware/cpu.yaml` would otherwise be ignored without a word."""
    user = user_config_dir()
    return [
        f"{path} is not used: {path.parent.name}={path.stem} is a shipped config, which "
        "comes first; rename the file"
        for path in sorted(user.glob("*/*.yaml"))
        if (conf_dir / path.parent.name / path.name).exists()
    ]


def searchpath_dirs(argv: Sequence[str]) -> list[Path]:
    """The local directories of a `hydra.searchpath=[file://DIR,…]` override; Hydra does
    not expand `~` there, so one is an error naming the full path."""
    dirs = []
    for arg in argv:
        name, _, value = arg.partition("=")
        if name.lstrip("+") == "hydra.searchpath":
            entries = (e.strip().strip("'\"") for e in value.strip("[]").split(","))
            for entry in entries:
                if not entry.startswith("file://"):
                    continue
                path = entry.removeprefix("file://")
                if path.startswith("~"):
                    raise SystemExit(
                        f"error: hydra.searchpath entry {entry}: Hydra does not expand ~; "
                        f"write file://{Path(path).expanduser()}"
                    )
                dirs.append(Path(path))
    return dirs


@final
class UserConfigs(SearchPathPlugin):
    """Puts the per-user configs (`paths.user_config_dir`) on every app's search path,
    after the shipped ones, so that `hardware=NAME` finds what calibrate wrote there."""

    @override
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not user_config_dir().is_dir():
            return  # Hydra would warn of a missing entry
        search_path.append(
            "specbeam-user", f"file://{user_config_dir()}", anchor=SearchPathQuery(provider="main")
        )


Plugins.instance().register(UserConfigs)
