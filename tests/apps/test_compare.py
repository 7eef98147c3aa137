"""Side-by-side runs: every method's figures are its own, though methods share models."""

from __future__ import annotations

from omegaconf import OmegaConf

from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import load_decoding, make_generator
from specbeam.data.task import TaskConfig
from specbeam.integration.models import ModelPairConfig, load_pair
from specbeam.paths import SHIPPED

SOURCES = ["En el principio crió Dios los cielos y la tierra.", "Y dijo Dios: Sea la luz.", "Amén."]


def test_peak_cache_of_each_method_is_its_own() -> None:
    task = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(TaskConfig),
            OmegaConf.load(SHIPPED / "conf/task/bible_es_en.yaml"),
        )
    )
    pair = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelPairConfig),
            OmegaConf.load(SHIPPED / "conf/model/tiny_random.yaml"),
        )
    )
    tokenizer = pair.load_tokenizer()
    vocab = tokenizer.vocab_info
    target, draft = load_pair(pair, vocab.size, with_draft=True)

    def runs() -> list[MethodRun]:
        return [
            MethodRun("beam", make_generator(load_decoding("beam"), target, None, vocab)),
            MethodRun(
                "spec_beam", make_generator(load_decoding("spec_beam"), target, draft, vocab)
            ),
        ]

    together = runs()
    run_side_by_side(together, tokenizer, SOURCES, task.src_lang, task.tgt_lang, batch_size=2)
    for method in runs():
        alone = [method]
        run_side_by_side(alone, tokenizer, SOURCES, task.src_lang, task.tgt_lang, batch_size=2)
        same = next(m for m in together if m.name == method.name)
        assert method.peak_cache_bytes == same.peak_cache_bytes > 0
