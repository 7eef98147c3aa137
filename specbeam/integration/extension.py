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

from dataclasses import dataclass, replace
from typing import Final, final

from fairseq2.assets import AssetStore
from fairseq2.composition import register_file_assets
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
from torch.nn import Module

from specbeam.apps.decoding import DecodingConfig
from specbeam.apps.hardware import load_hardware
from specbeam.apps.paths import REPO_ROOT
from specbeam.integration.cards import own_draft_path
from specbeam.integration.models import (
    Draft,
    check_same_pieces,
    check_same_vocabulary,
    load_model,
)
from specbeam.search.draft import DraftShape, draft_keywords
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.head import DraftHead
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator

SPECULATIVE_BEAM_SEARCH_GENERATOR: Final = "speculative_beam_search"

SPECULATIVE_GREEDY_GENERATOR: Final = "speculative_greedy"

SPECULATIVE_SAMPLING_GENERATOR: Final = "speculative_sampling"


@dataclass(kw_only=True)
class SpeculativeBeamSearchConfig(BeamSearchConfig):
    """`BeamSearchConfig` plus the draft; the output is that of plain beam search.

    Under `speculative_greedy`, `beam_size` and `draft_strategy` are ignored: the
    generator always runs with a beam of 1 and a linear (greedy) draft.
    """

    draft_model: str
    """The asset card name of the draft model; it must share the target's vocabulary."""

    gamma: int = 4
    """The draft depth: beam search steps proposed per target pass."""

    draft_strategy: str = "beam"
    """'beam' drafts a beam search tree below each hypothesis, 'linear' one greedy path,
    'topm' branches into the draft's best tokens where it is unsure."""

    draft_width: int | None = None
    """Nodes per tree level; ``None`` means `beam_size` (topm: times `draft_branch`)."""

    max_draft_nodes: int | None = None
    """If not ``None``, verifies only each source's most likely drafted nodes."""

    draft_branch: int = 2
    draft_branch_depth: int = 1
    draft_branch_below: float = 1.0
    draft_prune_margin: float | None = None
    gamma_bounds: tuple[int, int] | None = None
    """If not ``None``, adapts γ per source within these bounds."""

    draft_vocab: int | None = None
    """A draft head drafts from its this many most frequent target-side tokens (FR-Spec);
    ``None``: all the tokens it ranks; 0: the whole vocabulary."""

    hardware: str | None = "cpu"
    """The hardware config (`conf/hardware/<name>.yaml`) whose cost model chooses per
    batch between speculation and plain beam search (same output); ``None``: always
    speculate."""

    plan_tau: float = 1.8
    """The planner's guess of τ before it has seen a pass."""

    lean_target: bool = True
    """Runs the target's decoder as plain tensor ops (logits within 1e-5 of fairseq2's)."""

    def validate(self) -> ValidationResult:
        result = super().validate()

        if not self.draft_model:
            result.add_error("`draft_model` must be the name of a model asset card.")

        for name, value, allowed in self.draft_shape().problems():
            result.add_error(f"`{name}` must be {allowed}, but is {value!r} instead.")

        return result

    def draft_shape(self) -> DraftShape:
        return DraftShape.of(beam_size=self.beam_size, **draft_keywords(self))


@dataclass(kw_only=True)
class SpeculativeSamplingConfig(SamplingConfig):
    """`SamplingConfig` plus the draft; outputs follow the same distribution as
    fairseq2's sampling (speculative sampling, specbeam/search/sampling.py)."""

    draft_model: str
    """The asset card name of the draft model; it must share the target's vocabulary."""

    gamma: int = 4
    """Tokens the draft samples per target pass."""

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
        planner = None
        if config.hardware is not None:
            hardware = load_hardware(config.hardware)
            decoding = DecodingConfig(
                beam_size=config.beam_size, plan_tau=config.plan_tau, **draft_keywords(config)
            )
            planner = hardware.planner(decoding)

        return SpeculativeBeamSearchSeq2SeqGenerator(
            target,
            draft_model,
            self._tokenizer.vocab_info,
            algo,
            beam_size=config.beam_size,
            min_gen_len=config.min_gen_len,
            max_gen_len=_gen_len(config.max_gen_len),
            max_seq_len=config.max_seq_len,
            echo_prompt=config.echo_prompt,
            normalize_scores=config.normalize_scores,
            temperature=config.temperature,
            unk_penalty=config.unk_penalty,
            len_penalty=config.len_penalty,
            prefill_chunk_size=config.prefill_chunk_size,
            decode_capacity_increment=config.decode_capacity_increment,
            lean_target=config.lean_target,
            planner=planner,
            **draft_keywords(config),
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
            min_gen_len=config.min_gen_len,
            max_gen_len=_gen_len(config.max_gen_len),
            max_seq_len=config.max_seq_len,
            echo_prompt=config.echo_prompt,
            compute_scores=config.compute_scores,
            normalize_scores=config.normalize_scores,
            temperature=config.temperature,
            unk_penalty=config.unk_penalty,
            len_penalty=config.len_penalty,
            prefill_chunk_size=config.prefill_chunk_size,
            decode_capacity_increment=config.decode_capacity_increment,
            gamma=config.gamma,
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
    `speculative_sampling` Seq2SeqGenerators, and the embedded tasks' asset cards
    (`tasks/*/cards/`), so their models and tokenizers load by name."""
    for cards in sorted((REPO_ROOT / "tasks").glob("*/cards")):
        register_file_assets(container, cards, not_exist_ok=True)

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
