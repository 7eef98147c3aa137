"""Decoding settings and the generator they build: plain fairseq2 or speculative."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.generation.sampling import SamplingSeq2SeqGenerator, TopKSampler, TopPSampler
from fairseq2.models.seq2seq import Seq2SeqModel
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specbeam.paths import config_file
from specbeam.search.config import (
    MachineSettings,
    SearchSettings,
    SettingError,
    SpeculationSettings,
    SpeculativeSearchConfig,
)
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator


@dataclass(kw_only=True)
class DecodingConfig(SearchSettings):
    """A decoding file (`conf/decoding/`): the search settings (`SearchSettings`), and
    which search runs them. A file sets what differs from these defaults: fairseq2's and
    the search's, but for the apps' length limit; a machine's tuned values are in its
    hardware file (`HardwareConfig.tuned`)."""

    max_gen_len: tuple[float, int] = (1.5, 10)
    """a, b: at most a × (longest source in the batch) + b tokens (the apps' limit; the
    Python API keeps fairseq2's)."""

    name: str = "spec_beam"
    """The decoding's name (conf/decoding/<name>.yaml, or a method string such as
    `spec_beam:gamma=6`): picks its `hardware.tuned` settings and names it in messages
    and results."""
    speculative: bool = True
    """true: the draft (`model.draft`) proposes and the target verifies; false: the target
    alone (beam: the `plain` search; sample: fairseq2's sampling)."""
    search: str = "beam"
    """beam: fairseq2's beam search (exact speculation); sample: fairseq2's sampling
    (speculative sampling: the same distribution of outputs)."""
    sampler: str = "top_p"
    """sample: top_p or top_k."""
    top_p: float = 0.9
    """sampler=top_p: draw from the smallest set of tokens whose probabilities sum past
    this, in (0, 1] (fairseq2's `TopPSampler`)."""
    top_k: int = 50
    """sampler=top_k: draw from this many most likely tokens (fairseq2's `TopKSampler`)."""
    seed: int = 0
    """sample: seeds torch's generator, which fairseq2's samplers draw from."""

    @property
    def drafts(self) -> bool:
        return self.speculative

    def search_config(self, machine: MachineSettings | None = None) -> SpeculativeSearchConfig:
        """The one check of this decoding: its own settings here, its search settings
        where they are owned (`SpeculativeSearchConfig`), each error naming the setting
        as a decoding file does; the config its generator takes (`build_generator`)."""

        def bad(setting: str, value: object, allowed: str) -> ValueError:
            return ValueError(f"decoding.{setting}={value} is invalid: {allowed}")

        if self.search not in ("beam", "sample"):
            raise bad("search", self.search, "allowed: beam, sample")
        if self.sampler not in ("top_p", "top_k"):
            raise bad("sampler", self.sampler, "allowed: top_p, top_k")
        try:
            config = SpeculativeSearchConfig(self, machine or MachineSettings())
        except SettingError as error:
            raise bad(error.setting, error.value, f"must be {error.allowed}") from None
        if self.max_speculative_batch > 0 and self.search != "beam":
            raise bad(
                "max_speculative_batch", self.max_speculative_batch,
                "applies to exact speculative beam search only (set it to 0)",
            )  # fmt: skip
        return config

    def validate(self) -> None:
        """Raises a ValueError naming the first setting out of range (`search_config`)."""
        self.search_config()

    def unused(self, settings: Collection[str]) -> list[str]:
        """Those of `settings` this decoding never reads: without speculation, the draft
        tree's, acceptance's and planning's (a plain beam search still reads which plain
        search runs, `plain`, and `lean_target`); without sampling, the samplers'."""
        idle = set() if self.search == "sample" else set(SAMPLING)
        if not self.speculative:
            idle |= {f.name for f in dataclasses.fields(SpeculationSettings)}
            if self.search == "beam":
                idle -= {"plain", "lean_target"}
        return sorted(set(settings) & idle)

    def method_settings(self) -> tuple[str, set[str]]:
        """The decoding file `name` is made from, and the settings its method string sets."""
        base, dotlist = parse_method(self.name)
        return base, {item.split("=", 1)[0] for item in dotlist}


SAMPLING = ("sampler", "top_p", "top_k", "seed")
"""The settings only sampling reads."""


def reaching(bounds: Sequence[int] | None, gamma: int) -> list[int] | None:
    """Adaptive γ bounds widened to include γ, so that bounds tuned for another γ (a
    hardware file's, `HardwareConfig.tune`) never reject the γ a user or a calibration
    grid chose; None (no adaptation) stays None."""
    return None if bounds is None else [min(bounds[0], gamma), max(bounds[1], gamma)]


def parse_method(method: str) -> tuple[str, list[str]]:
    """`name:key=value;key=value` -> the decoding's name and its settings as a dotlist."""
    name, _, overrides = method.partition(":")
    return name, [item for item in overrides.split(";") if item]


def load_decoding(method: str) -> DecodingConfig:
    """`name` or `name:key=value;key=value`, e.g. `spec_beam:gamma=6;draft_width=8`."""
    name, dotlist = parse_method(method)
    try:
        path = config_file("decoding", name)
    except ValueError as error:
        raise ValueError(f"methods: {error}") from None
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(DecodingConfig),
            OmegaConf.load(path),
            OmegaConf.from_dotlist(dotlist),
            {"name": method},
        )
    except OmegaConfBaseException as error:  # a misspelt or mistyped setting: its first line
        raise ValueError(f"methods: {method}: {str(error).splitlines()[0]}") from None
    return OmegaConf.to_object(merged)


def make_generator(
    cfg: DecodingConfig,
    target: Seq2SeqModel,
    draft: Seq2SeqModel | None,
    vocab_info: VocabularyInfo,
    machine: MachineSettings | None = None,
) -> Seq2SeqGenerator:
    """The generator of a decoding on a machine (`hardware`; None: the defaults), the
    decoding checked here (`DecodingConfig.search_config`)."""
    return build_generator(cfg.search_config(machine), target, draft, vocab_info)


def build_generator(
    config: SpeculativeSearchConfig,
    target: Seq2SeqModel,
    draft: Seq2SeqModel | None,
    vocab_info: VocabularyInfo,
) -> Seq2SeqGenerator:
    """The generator of a checked decoding (`DecodingConfig.search_config`), which it
    takes as it is."""
    cfg = config.search
    assert isinstance(cfg, DecodingConfig)
    if cfg.speculative and draft is None:
        raise ValueError(f"decoding={cfg.name} is speculative but the model pair has no draft")
    if cfg.search == "sample":
        torch.manual_seed(cfg.seed)
        sampler = TopPSampler(cfg.top_p) if cfg.sampler == "top_p" else TopKSampler(cfg.top_k)
        if not cfg.speculative:
            return SamplingSeq2SeqGenerator(
                target, vocab_info, sampler, min_gen_len=cfg.min_gen_len, max_gen_len=cfg.gen_len,
                unk_penalty=cfg.unk_penalty, len_penalty=cfg.len_penalty,
                temperature=cfg.temperature,
            )  # fmt: skip
        assert draft is not None
        return SpeculativeSamplingSeq2SeqGenerator(
            target, draft, vocab_info, sampler, config=config
        )
    if not cfg.speculative and cfg.plain == "fairseq2":
        return BeamSearchSeq2SeqGenerator(target, vocab_info, **cfg.fairseq2_keywords())
    return SpeculativeBeamSearchSeq2SeqGenerator(
        target, draft if cfg.speculative else None, vocab_info, config=config
    )
