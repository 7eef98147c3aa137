"""What specbeam's Hydra apps share: the settings of a translation pipeline, building it,
and turning bad settings into one-line errors."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from specbeam import startup
from specbeam.apps.decoding import DecodingConfig, make_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.apps.task import TaskConfig
from specbeam.integration import entry_point
from specbeam.integration.models import ModelPairConfig, open_pair
from specbeam.paths import SHIPPED

R = TypeVar("R")


@dataclass(kw_only=True)
class PipelineConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)

    def build(self) -> tuple[Tokenizer, Seq2SeqGenerator]:
        """A non-speculative decoding leaves the pair's draft unloaded rather than
        refusing it: the draft belongs to the model pair, which every decoding shares
        (the default pair has one, and `decoding=beam` runs on it)."""
        self.hardware.apply()
        self.decoding.validate()  # as given: a bad value is an error even where tuning replaces it
        self.decoding = self.hardware.tune(self.decoding, command_line_settings("decoding"))
        self.decoding.validate()
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
        generator = make_generator(self.decoding, pair.target, pair.draft, vocab, self.hardware)
        startup.done()
        return pair.tokenizer, generator


def command_line_settings(group: str) -> set[str]:
    """Settings of a config group given on this Hydra app's command line
    (`decoding.gamma=6` -> {"gamma"}); empty outside a Hydra app."""
    if not HydraConfig.initialized():
        return set()
    names = (o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task)
    return {n.split(".", 1)[1] for n in names if n.startswith(f"{group}.")}


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
    scripts/merge_shards.py finds; stdout (-) stays stdout."""
    i, n = parse_shard(shard)
    return path if path == "-" or n == 1 else f"{path}.shard-{i}-of-{n}"


def run_app(app: Callable[[Any], R], cfg: DictConfig) -> R:
    """Runs an app on its structured config; a bad setting or a missing file ends the
    process with one line naming the problem, not a traceback."""
    try:
        return app(OmegaConf.to_object(cfg))
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None


def before_hydra(argv: Sequence[str]) -> None:
    """What an app's command line does before Hydra runs it: group choices are checked,
    and fairseq2 will not register the generators for recipes, which these processes do
    not run (0.8 s of start-up, `specbeam/integration/entry_point.py`)."""
    check_group_choices(argv)
    entry_point.skip_generators()


def check_group_choices(argv: Sequence[str], conf_dir: Path = SHIPPED / "conf") -> None:
    """Ends the process with one line when an override picks a config that does not
    exist (`decoding=nope`), naming the ones that do; Hydra would print a dozen lines.
    Directories of `hydra.searchpath=[file://DIR,…]` count too: a calibrated hardware
    config may live outside the repository (`calibrate hardware_dir=DIR/hardware`)."""
    dirs = [conf_dir, *searchpath_dirs(argv)]
    for arg in argv:
        group, sep, value = arg.partition("=")
        if not sep or not group.isidentifier() or not (conf_dir / group).is_dir():
            continue
        allowed = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
        for choice in value.split(","):  # a multirun sweeps over several
            if choice not in allowed and "(" not in choice:
                raise SystemExit(
                    f"error: {group}={choice} is unknown; allowed: {', '.join(allowed)}"
                )


def searchpath_dirs(argv: Sequence[str]) -> list[Path]:
    """The local directories of a `hydra.searchpath=[file://DIR,…]` override."""
    dirs = []
    for arg in argv:
        name, _, value = arg.partition("=")
        if name.lstrip("+") == "hydra.searchpath":
            entries = (e.strip().strip("'\"") for e in value.strip("[]").split(","))
            dirs += [Path(e.removeprefix("file://")) for e in entries if e.startswith("file://")]
    return dirs
