"""specbeam as a fairseq2 extension.

fairseq2 runs `register_specbeam` for every process that builds its dependency container
(entry point group `fairseq2.extension`, through `specbeam/integration/entry_point.py`,
which specbeam's own command lines tell to skip it), so any recipe with a
`seq2seq_generator` section can select the speculative generator by name::

    seq2seq_generator.name=speculative_beam_search
    seq2seq_generator.config.draft_model=<asset card of the draft>

The registration mirrors fairseq2's own beam search (`fairseq2.recipe.composition.
beam_search`): a named `Seq2SeqGenerator` component whose factory takes the recipe's
model, tokenizer and beam search algorithm, plus the draft, which is loaded by asset card
name through fairseq2's model hub.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Final, final

from fairseq2.assets import AssetStore
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.data.tokenizers.hub import GlobalTokenizerLoader
from fairseq2.gang import Gangs
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.generation.beam_search import BeamSearchAlgorithm
from fairseq2.generation.sampling import Sampler
from fairseq2.models.hub import GlobalModelLoader
from fairseq2.models.transformer import TransformerModel
from fairseq2.recipe.component import (
    ComponentManager,
    ComponentNotKnownError,
    register_component,
)
from fairseq2.recipe.config import BeamSearchConfig, SamplingConfig
from fairseq2.recipe.error import (
    BeamSearchAlgorithmNotKnownError,
    ModelTypeNotValidError,
    SamplerNotKnownError,
    raise_model_type_not_valid_error,
)
from fairseq2.runtime.dependency import (
    DependencyContainer,
    DependencyResolver,
    wire_object,
)
from fairseq2.utils.validation import ValidationResult
from omegaconf import OmegaConf
from torch.nn import Module

from specbeam.integration.hub import own_draft_path
from specbeam.integration.models import (
    Draft,
    check_same_pieces,
    check_same_vocabulary,
    load_model,
)
from specbeam.paths import config_file
from specbeam.search.config import (
    MachineSettings,
    SearchSettings,
    SpeculationSettings,
    SpeculativeSearchConfig,
    settings_of,
)
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator

SPECULATIVE_BEAM_SEARCH_GENERATOR: Final = "speculative_beam_search"

SPECULATIVE_GREEDY_GENERATOR: Final = "speculative_greedy"

SPECULATIVE_SAMPLING_GENERATOR: Final = "speculative_sampling"


@dataclass(kw_only=True)
class SpeculativeBeamSearchConfig(BeamSearchConfig, SpeculationSettings):
    """`BeamSearchConfig` plus the speculation's settings (`SpeculationSettings`) and the
    draft; exact unless `relax_top` is set.

    Under `speculative_greedy`, `beam_size` and `draft_strategy` are ignored: the
    generator always runs with a beam of 1 and a linear (greedy) draft.
    """

    draft_model: str
    """The asset card name of the draft model; it must share the target's vocabulary."""

    hardware: str | None = "cpu"
    """The hardware config (`conf/hardware/<name>.yaml`) whose machine settings (kernels,
    memory budget, the planner's costs) the search runs with; ``None``: the defaults,
    without a planner."""

    def validate(self) -> ValidationResult:
        result = super().validate()

        if not self.draft_model:
            result.add_error("`draft_model` must be the name of a model asset card.")

        for name, value, allowed in self.search_settings().problems():
            result.add_error(f"`{name}` must be {allowed}, but is {value!r} instead.")

        return result

    def search_settings(self) -> SearchSettings:
        return settings_of(SearchSettings, self, max_gen_len=_gen_len(self.max_gen_len))

    def search_config(self) -> SpeculativeSearchConfig:
        machine = MachineSettings() if self.hardware is None else load_machine(self.hardware)
        return SpeculativeSearchConfig(self.search_settings(), machine)


def load_machine(name: str) -> MachineSettings:
    """The machine settings of `conf/hardware/<name>.yaml`; the file's other settings
    (threads, precisions, batching) belong to specbeam's own apps."""
    stored = OmegaConf.to_container(OmegaConf.load(config_file("hardware", name)))
    assert isinstance(stored, dict)
    names = {f.name for f in fields(MachineSettings)}
    merged = OmegaConf.merge(
        OmegaConf.structured(MachineSettings), {k: v for k, v in stored.items() if k in names}
    )
    return OmegaConf.to_object(merged)


@dataclass(kw_only=True)
class SpeculativeSamplingConfig(SamplingConfig):
    """`SamplingConfig` plus the draft; outputs follow the same distribution as
    fairseq2's sampling (speculative sampling, specbeam/search/sampling.py)."""

    draft_model: str
    """The asset card name of the draft model; it must share the target's vocabulary."""

    gamma: int = SpeculationSettings.gamma
    """Tokens the draft samples per target pass."""

    hardware: str | None = "cpu"
    """As in `SpeculativeBeamSearchConfig`."""

    def search_config(self) -> SpeculativeSearchConfig:
        search = settings_of(SearchSettings, self, max_gen_len=_gen_len(self.max_gen_len))
        machine = MachineSettings() if self.hardware is None else load_machine(self.hardware)
        return SpeculativeSearchConfig(search, machine)

    def validate(self) -> ValidationResult:
        result = super().validate()

        if not self.draft_model:
            result.add_error("`draft_model` must be the name of a model asset card.")

        if self.gamma < 1:
            result.add_error(f"`gamma` must be ≥ 1, but is {self.gamma!r} instead.")

        return result


@final
class _SpeculativeSeq2SeqGeneratorFactory:
    """fairseq2's `_BeamSearchSeq2SeqGeneratorFactory` and
    `_SamplingSeq2SeqGeneratorFactory`, plus loading the draft.

    Both models must be `TransformerModel`s: the draft tree is decoded with tree masks
    through their decoders.
    """

    def __init__(
        self,
        model: Module,
        tokenizer: Tokenizer,
        component_manager: ComponentManager,
        model_loader: GlobalModelLoader,
        tokenizer_loader: GlobalTokenizerLoader,
        asset_store: AssetStore,
        gangs: Gangs,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._component_manager = component_manager
        self._model_loader = model_loader
        self._tokenizer_loader = tokenizer_loader
        self._asset_store = asset_store
        self._gangs = gangs

    def create(self, config: SpeculativeBeamSearchConfig) -> Seq2SeqGenerator:
        try:
            algo = self._component_manager.create_component(
                BeamSearchAlgorithm, config.algo.name, config.algo.config
            )
        except ComponentNotKnownError:
            raise BeamSearchAlgorithmNotKnownError(config.algo.name) from None

        target, draft_model = self._load_pair(config.draft_model)

        return SpeculativeBeamSearchSeq2SeqGenerator(
            target, draft_model, self._tokenizer.vocab_info, algo, config=config.search_config()
        )

    def create_sampling(self, config: SpeculativeSamplingConfig) -> Seq2SeqGenerator:
        try:
            sampler = self._component_manager.create_component(
                Sampler, config.sampler.name, config.sampler.config
            )
        except ComponentNotKnownError:
            raise SamplerNotKnownError(config.sampler.name) from None

        target, draft_model = self._load_pair(config.draft_model)

        return SpeculativeSamplingSeq2SeqGenerator(
            target,
            draft_model,
            self._tokenizer.vocab_info,
            sampler,
            config=config.search_config(),
            compute_scores=config.compute_scores,
        )

    def _load_pair(self, draft_name: str) -> tuple[TransformerModel, Draft]:
        """The recipe's model and the draft: both decode trees, so both are Transformers."""
        if not isinstance(self._model, TransformerModel):
            raise_model_type_not_valid_error(self._model, TransformerModel)

        return self._model, self._load_draft_model(draft_name, self._model)

    def _load_draft_model(self, name: str, target: TransformerModel) -> Draft:
        """Loads the draft on the recipe's gangs, in the target's data type, frozen."""
        dtype = next(target.parameters()).dtype

        card = self._asset_store.retrieve_card(name)

        # A decoder over the target's encoder, or a head over its states: only the
        # recipe's model completes it.
        own = own_draft_path(card)

        if own is not None:
            draft_model = load_model(own, dtype, target=target)
        else:
            draft_model = self._model_loader.load(
                name,
                self._gangs,
                device=None,
                dtype=dtype,
                config=None,
                load_rank0_only=False,
                mmap=False,
            )

        if not isinstance(draft_model, TransformerModel | DraftHead):
            raise ModelTypeNotValidError(
                type(draft_model), TransformerModel, section_name="seq2seq_generator"
            )

        check_same_vocabulary(target, draft_model)

        # A draft card that names its tokenizer must use the recipe's pieces.
        if card.maybe_get_field("tokenizer_family") is not None:
            draft_tokenizer = self._tokenizer_loader.load(name, self._gangs, None)

            check_same_pieces(self._tokenizer, draft_tokenizer)

        draft_model.requires_grad_(False)

        return draft_model


def _gen_len(max_gen_len: int | tuple[float, int]) -> tuple[float, int]:
    """fairseq2's configs allow a plain length; its generators take (a, b)."""
    return (0.0, max_gen_len) if isinstance(max_gen_len, int) else max_gen_len


def register_specbeam(container: DependencyContainer) -> None:
    """Registers the `speculative_beam_search`, `speculative_greedy` and
    `speculative_sampling` Seq2SeqGenerators (the entry point registers the embedded
    tasks' asset cards)."""

    def create_factory(
        resolver: DependencyResolver,
    ) -> _SpeculativeSeq2SeqGeneratorFactory:
        model = resolver.resolve(Module, key="model")

        return wire_object(resolver, _SpeculativeSeq2SeqGeneratorFactory, model=model)

    container.register(_SpeculativeSeq2SeqGeneratorFactory, create_factory)

    def create_beam_search(
        resolver: DependencyResolver, config: SpeculativeBeamSearchConfig
    ) -> Seq2SeqGenerator:
        factory = resolver.resolve(_SpeculativeSeq2SeqGeneratorFactory)

        return factory.create(config)

    register_component(
        container,
        Seq2SeqGenerator,
        SPECULATIVE_BEAM_SEARCH_GENERATOR,
        config_kls=SpeculativeBeamSearchConfig,
        factory=create_beam_search,
    )

    def create_greedy(
        resolver: DependencyResolver, config: SpeculativeBeamSearchConfig
    ) -> Seq2SeqGenerator:
        config = replace(config, beam_size=1, draft_strategy="linear")

        return create_beam_search(resolver, config)

    register_component(
        container,
        Seq2SeqGenerator,
        SPECULATIVE_GREEDY_GENERATOR,
        config_kls=SpeculativeBeamSearchConfig,
        factory=create_greedy,
    )

    def create_sampling(
        resolver: DependencyResolver, config: SpeculativeSamplingConfig
    ) -> Seq2SeqGenerator:
        factory = resolver.resolve(_SpeculativeSeq2SeqGeneratorFactory)

        return factory.create_sampling(config)

    register_component(
        container,
        Seq2SeqGenerator,
        SPECULATIVE_SAMPLING_GENERATOR,
        config_kls=SpeculativeSamplingConfig,
        factory=create_sampling,
    )
