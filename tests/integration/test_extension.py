"""specbeam as a fairseq2 extension, through fairseq2's own recipe machinery.

The end-to-end test runs a tiny inference recipe with fairseq2's command line entry
(`fairseq2.recipe.cli.main`): fairseq2 builds its dependency container, loads the
`fairseq2.extension` entry points (ours among them), structures the recipe config with
`seq2seq_generator.name=speculative_beam_search` from the command line, loads target and
draft by asset card name from `common.assets.extra_paths`, and the recipe asks for its
`Seq2SeqGenerator`. Nothing is bypassed; only the tokenizer is a test family, since the
tiny models' 48-token vocabulary belongs to no real tokenizer.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from importlib.metadata import entry_points
from pathlib import Path
from types import NoneType
from typing import final

import pytest
import torch
from fairseq2.composition import register_tokenizer_family
from fairseq2.data.tokenizers import TokenDecoder, TokenEncoder, Tokenizer, VocabularyInfo
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput
from fairseq2.models.transformer import (
    TransformerModel,
    get_default_sdpa_factory,
    set_default_sdpa_factory,
)
from fairseq2.recipe.base import Recipe, RecipeContext
from fairseq2.recipe.cli import main
from fairseq2.recipe.component import ComponentManager
from fairseq2.recipe.config import (
    BEAM_SEARCH_GENERATOR,
    BeamSearchConfig,
    CommonSection,
    GangSection,
    ReferenceModelSection,
    Seq2SeqGeneratorSection,
    TokenizerSection,
)
from fairseq2.runtime.dependency import DependencyContainer
from fairseq2.task import Task
from typing_extensions import override

from specbeam.apps.hardware import load_hardware
from specbeam.data.batches import pad
from specbeam.integration import entry_point, extension
from specbeam.integration.cards import model_card, tokenizer_fields, write_cards
from specbeam.integration.extension import (
    SPECULATIVE_GREEDY_GENERATOR,
    SPECULATIVE_SAMPLING_GENERATOR,
    SpeculativeBeamSearchConfig,
)
from specbeam.integration.models import build_shallow_draft, save_head, save_model
from specbeam.search.config import MachineSettings, SearchSettings
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead, HeadArch
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator
from specbeam.search.stats import SpeculativeGeneratorOutput
from tests.conftest import DRAFT_ARCH, PROMPT, TARGET_ARCH, VOCAB, sources

SCORE_TOL = 1e-5  # as in test_generator.py: tree-masked fp32 log-probs differ by ≤ 1e-6

TEST_TOKENIZER_FAMILY = "specbeam_test_vocab"


def test_entry_point_is_installed() -> None:
    (installed,) = [e for e in entry_points(group="fairseq2.extension") if e.name == "specbeam"]

    assert installed.value == "specbeam.integration.entry_point:register_specbeam"
    assert installed.load() is entry_point.register_specbeam


@pytest.mark.parametrize("skip", [False, True])
def test_apps_skip_the_generators_registration(skip: bool) -> None:
    """specbeam's command lines skip the registration (and the recipe package it
    imports); any other process still gets the generators."""
    probe = """
import sys
from specbeam.integration import entry_point
if sys.argv[1] == "skip":
    entry_point.skip_generators()
import fairseq2
resolver = fairseq2.init_fairseq2()
recipe = "fairseq2.recipe" in sys.modules
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.recipe.component import _ComponentEntry
key = (Seq2SeqGenerator, "speculative_beam_search")
print(recipe, resolver.resolve_optional(_ComponentEntry, key=key) is not None)
"""
    out = subprocess.run(
        [sys.executable, "-c", probe, "skip" if skip else "register"],
        capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert out.stdout.split() == (["False", "False"] if skip else ["True", "True"])


def test_config_validation() -> None:
    assert not SpeculativeBeamSearchConfig(draft_model="draft").validate().has_error()

    bad = SpeculativeBeamSearchConfig(
        draft_model="", gamma=0, draft_strategy="wide", draft_width=0, max_draft_nodes=0
    )
    errors = bad.validate().errors
    assert len(errors) == 5
    for name in ("draft_model", "gamma", "draft_strategy", "draft_width", "max_draft_nodes"):
        assert any(f"`{name}`" in error for error in errors), name


def test_every_search_setting_reaches_the_generators_config() -> None:
    """No path drops a setting: the extension's config carries every search setting, by
    fairseq2's name or the speculation's, and the hardware file's machine settings (the
    same that specbeam's own apps read) arrive beside them."""
    carried = {f.name for f in fields(SpeculativeBeamSearchConfig)}
    assert {f.name for f in fields(SearchSettings)} <= carried
    recipe = SpeculativeBeamSearchConfig(
        draft_model="draft", gamma=2, lean_draft=False, plain="lean", max_gen_len=(1.5, 10)
    )
    config = recipe.search_config()
    search = config.search
    assert (search.gamma, search.lean_draft, search.plain, search.gen_len) == (
        2,
        False,
        "lean",
        (1.5, 10),
    )
    hardware = load_hardware("cpu")
    for setting in fields(MachineSettings):
        assert getattr(config.machine, setting.name) == getattr(hardware, setting.name), (
            setting.name
        )
    assert config.planner() is not None  # hardware=cpu stores costs
    unplanned = SpeculativeBeamSearchConfig(draft_model="draft", hardware=None).search_config()
    assert unplanned.machine == MachineSettings() and unplanned.planner() is None


@final
class _VocabOnlyTokenizer(Tokenizer):
    """The recipe's tokenizer: the generators need its vocabulary only."""

    @override
    def create_encoder(
        self,
        *,
        task: str | None = None,
        lang: str | None = None,
        mode: str | None = None,
        device: torch.device | None = None,
        pin_memory: bool = False,
    ) -> TokenEncoder:
        raise NotImplementedError

    @override
    def create_raw_encoder(
        self, *, device: torch.device | None = None, pin_memory: bool = False
    ) -> TokenEncoder:
        raise NotImplementedError

    @override
    def create_decoder(self, *, skip_special_tokens: bool = False) -> TokenDecoder:
        raise NotImplementedError

    @property
    @override
    def vocab_info(self) -> VocabularyInfo:
        return VOCAB


@final
class _OneCallTask(Task):
    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn = fn

    @override
    def run(self) -> None:
        self._fn()

    @override
    def request_stop(self) -> None:
        pass

    @property
    @override
    def step_nr(self) -> int:
        return 0

    @override
    def close(self) -> None:
        pass


@dataclass(kw_only=True)
class _TranslateConfig:
    model: ReferenceModelSection = field(
        default_factory=lambda: ReferenceModelSection(name="specbeam_test_target")
    )
    tokenizer: TokenizerSection = field(
        default_factory=lambda: TokenizerSection(family=TEST_TOKENIZER_FAMILY)
    )
    seq2seq_generator: Seq2SeqGeneratorSection = field(
        default_factory=lambda: Seq2SeqGeneratorSection()
    )
    common: CommonSection = field(default_factory=lambda: CommonSection())
    gang: GangSection = field(default_factory=lambda: GangSection())


@dataclass
class _Outputs:
    generator: Seq2SeqGenerator | None = None
    spec: SequenceGeneratorOutput | None = None
    base: SequenceGeneratorOutput | None = None


@final
class _TranslateRecipe(Recipe):
    """Translates a batch with the configured generator and with fairseq2's beam search."""

    def __init__(self) -> None:
        self.outputs = _Outputs()

    @override
    def register(self, container: DependencyContainer) -> None:
        register_tokenizer_family(
            container,
            TEST_TOKENIZER_FAMILY,
            kls=Tokenizer,
            config_kls=NoneType,
            loader=lambda path, config: _VocabOnlyTokenizer(),
        )

    @override
    def create_task(self, context: RecipeContext) -> Task:
        section = context.get_config_as(_TranslateConfig).seq2seq_generator
        generator = context.get_seq2seq_generator()
        if section.name == SPECULATIVE_SAMPLING_GENERATOR:
            return _OneCallTask(lambda: self._translate(generator, None))

        # The same settings, through fairseq2's own beam search component.
        base_config = BeamSearchConfig(
            **{f.name: getattr(section.config, f.name) for f in fields(BeamSearchConfig)}
        )
        if section.name == SPECULATIVE_GREEDY_GENERATOR:
            base_config.beam_size = 1
        base_generator = context.resolver.resolve(ComponentManager).create_component(
            Seq2SeqGenerator, BEAM_SEARCH_GENERATOR, base_config
        )

        return _OneCallTask(lambda: self._translate(generator, base_generator))

    def _translate(self, generator: Seq2SeqGenerator, base: Seq2SeqGenerator | None) -> None:
        src, src_layout = pad(sources(seed=7, batch=6), VOCAB.pad_idx)
        prompts, prompt_layout = pad([PROMPT] * 6, VOCAB.pad_idx)
        self.outputs.generator = generator
        self.outputs.spec = generator(src, src_layout, prompts, prompt_layout)
        if base is not None:
            self.outputs.base = base(src, src_layout, prompts, prompt_layout)

    @property
    @override
    def config_kls(self) -> type[object]:
        return _TranslateConfig


@pytest.fixture
def assets_dir(tmp_path: Path, tiny_target: TransformerModel, tiny_draft: TransformerModel) -> Path:
    """Cards written by specbeam.integration.cards for checkpoints written by specbeam.integration.models."""
    assets_dir = tmp_path / "assets"
    (tmp_path / "models").mkdir()
    cards = []
    for name, model, arch in [
        ("specbeam_test_target", tiny_target, TARGET_ARCH),
        ("specbeam_test_draft", tiny_draft, DRAFT_ARCH),
    ]:
        checkpoint = tmp_path / "models" / f"{name}.pt"
        save_model(model, arch, checkpoint, torch.float16)
        card = model_card(name, checkpoint, assets_dir)
        if name == "specbeam_test_draft":  # a draft card naming its tokenizer gets it checked
            spm = Path(__file__).resolve().parents[2] / "tasks/bible_es_en/spm.model"
            card.update(tokenizer_fields(spm, assets_dir, ["spa_Latn", "eng_Latn"], "eng_Latn"))
        cards.append(card)
    shallow = tmp_path / "models" / "specbeam_test_shallow.pt"
    draft = build_shallow_draft(copy.deepcopy(tiny_target), DRAFT_ARCH)
    save_model(draft, DRAFT_ARCH, shallow, torch.float16, shares_encoder=True)
    cards.append(model_card("specbeam_test_shallow", shallow, assets_dir))
    head = tmp_path / "models" / "specbeam_test_head.pt"
    save_head(DraftHead(copy.deepcopy(tiny_target), HeadArch(num_layers=1)), head, torch.float16)
    cards.append(model_card("specbeam_test_head", head, assets_dir))
    write_cards(assets_dir / "cards.yaml", cards)
    return assets_dir


@pytest.fixture
def restore_process_state() -> Iterator[None]:
    """A recipe run configures the process (env, threads, SDPA); undo it for later tests."""
    env, sdpa = dict(os.environ), get_default_sdpa_factory()
    yield
    os.environ.clear()
    os.environ.update(env)
    set_default_sdpa_factory(sdpa)
    torch.set_num_threads(1)


def _run_recipe(
    monkeypatch: pytest.MonkeyPatch, output_dir: Path, assets_dir: Path, overrides: list[str]
) -> _Outputs:
    """Runs the recipe as `python -m <recipe> OUTPUT_DIR --config ...` would."""
    recipe = _TranslateRecipe()
    argv = [
        "specbeam-test-recipe",
        str(output_dir),
        "--no-rich",
        "--no-exit-on-error",
        "--config",
        f"common.assets.extra_paths=[{assets_dir}]",
        f"tokenizer.path={assets_dir}",
        "common.torch.num_threads=1",
        "common.metric_recorders.tensorboard.enabled=false",
        *overrides,
    ]
    monkeypatch.setattr(sys, "argv", argv)
    main(recipe)
    return recipe.outputs


def _assert_same_weights(loaded: torch.nn.Module, trained: torch.nn.Module) -> None:
    want = trained.state_dict()
    got = loaded.state_dict()
    assert got.keys() == want.keys()
    for key, value in got.items():  # the cards point at fp16 checkpoints, as shipped ones do
        assert torch.equal(value, want[key].to(torch.float16).to(value.dtype)), key


def _assert_same(base: SequenceGeneratorOutput, spec: SequenceGeneratorOutput) -> None:
    assert len(base.hypotheses) == len(spec.hypotheses)
    for i, (want, got) in enumerate(zip(base.hypotheses, spec.hypotheses, strict=True)):
        assert [h.seq.tolist() for h in got] == [h.seq.tolist() for h in want], f"source {i}"
        for h, g in zip(want, got, strict=True):
            assert abs(float(h.score) - float(g.score)) <= SCORE_TOL


@pytest.mark.usefixtures("restore_process_state")
@pytest.mark.parametrize(
    ("name", "beam_size", "strategy"),
    [("speculative_beam_search", 3, "beam"), ("speculative_greedy", 1, "linear")],
)
def test_recipe_selects_generator_by_name(
    name: str,
    beam_size: int,
    strategy: str,
    tmp_path: Path,
    assets_dir: Path,
    tiny_target: TransformerModel,
    tiny_draft: TransformerModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    overrides = [
        f"seq2seq_generator.name={name}",
        "seq2seq_generator.config.draft_model=specbeam_test_draft",
        "seq2seq_generator.config.hardware=null",  # always speculate: that is what is tested
        "seq2seq_generator.config.gamma=3",
        "seq2seq_generator.config.beam_size=3",  # speculative_greedy ignores it
        "seq2seq_generator.config.max_gen_len=24",
    ]
    checked = []
    monkeypatch.setattr(
        extension, "check_same_pieces", lambda target, draft: checked.append(type(draft).__name__)
    )
    out = _run_recipe(monkeypatch, tmp_path / "out", assets_dir, overrides)
    assert checked == ["NllbTokenizer"]  # the draft card's tokenizer, against the recipe's

    generator = out.generator
    assert isinstance(generator, SpeculativeBeamSearchSeq2SeqGenerator)
    assert (
        generator.config.search.beam_size == beam_size
        and generator._draft_shape.strategy == strategy
    )
    # Both models came from their asset cards.
    _assert_same_weights(generator.model, tiny_target)
    _assert_same_weights(generator.draft_model, tiny_draft)

    assert isinstance(out.base, SequenceGeneratorOutput)
    assert isinstance(out.spec, SpeculativeGeneratorOutput)
    assert out.spec.stats.target_passes > 0
    _assert_same(out.base, out.spec)


@pytest.mark.usefixtures("restore_process_state")
@pytest.mark.parametrize("draft", ["specbeam_test_shallow", "specbeam_test_head"])
def test_recipe_builds_a_shallow_draft_over_its_own_model(
    tmp_path: Path, assets_dir: Path, monkeypatch: pytest.MonkeyPatch, draft: str
) -> None:
    """A draft card of family specbeam_shallow_draft (or specbeam_draft_head): the
    decoder (the head) is completed with the recipe model's encoder (and its front-end,
    final norm and projection), which encodes each source once for both."""
    overrides = [
        "seq2seq_generator.name=speculative_beam_search",
        f"seq2seq_generator.config.draft_model={draft}",
        "seq2seq_generator.config.hardware=null",  # always speculate: that is what is tested
        "seq2seq_generator.config.gamma=3",
        "seq2seq_generator.config.beam_size=3",
        "seq2seq_generator.config.max_gen_len=24",
    ]
    out = _run_recipe(monkeypatch, tmp_path / "out", assets_dir, overrides)
    generator = out.generator
    assert isinstance(generator, SpeculativeBeamSearchSeq2SeqGenerator)
    assert generator.draft_model.encoder is generator.model.encoder
    assert generator.drafts_with_head == (draft == "specbeam_test_head")
    assert isinstance(out.spec, SpeculativeGeneratorOutput) and out.spec.stats.target_passes > 0
    _assert_same(out.base, out.spec)


@pytest.mark.usefixtures("restore_process_state")
def test_recipe_selects_speculative_sampling_by_name(
    tmp_path: Path,
    assets_dir: Path,
    tiny_target: TransformerModel,
    tiny_draft: TransformerModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fairseq2's sampler components (here top-k) drive the speculative sampler. The
    section's default config is beam search's, so `set:` replaces it whole."""
    overrides = [
        f"seq2seq_generator.name={SPECULATIVE_SAMPLING_GENERATOR}",
        "set:seq2seq_generator.config={draft_model: specbeam_test_draft, gamma: 3, "
        "max_gen_len: 12, sampler: {name: top_k, config: {k: 5}}}",
    ]
    out = _run_recipe(monkeypatch, tmp_path / "out", assets_dir, overrides)
    generator = out.generator
    assert isinstance(generator, SpeculativeSamplingSeq2SeqGenerator)
    _assert_same_weights(generator.model, tiny_target)
    _assert_same_weights(generator._draft_model, tiny_draft)
    assert isinstance(out.spec, SpeculativeGeneratorOutput)
    assert [len(hyps) for hyps in out.spec.hypotheses] == [1] * 6
    assert all(h.seq[-1] == VOCAB.eos_idx and len(h.seq) <= 12 for [h] in out.spec.hypotheses)
    assert out.spec.stats.target_passes > 0
