"""Side-by-side runs: several decoding methods on the same batches, interleaved.

Every batch is decoded by every method in turn, so machine noise (other processes,
frequency changes) falls on all methods alike; speedups are ratios of totals measured in
the same run, with the same models, inputs and threads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator
from torch.nn import Module
from tqdm import tqdm

from specbeam.data.batches import pad
from specbeam.data.inference import encode_sources, target_prompt
from specbeam.search.peak_cache import PeakCacheProbe
from specbeam.search.stats import SpecStats, SpeculativeGeneratorOutput


@dataclass
class MethodRun:
    name: str
    generator: Seq2SeqGenerator
    seconds: list[float] = field(default_factory=list)  # per batch
    outputs: list[str] = field(default_factory=list)  # per sentence, input order
    tokens: list[list[list[int]]] = field(default_factory=list)  # n-best token ids
    stats: SpecStats = field(default_factory=SpecStats)
    generated_tokens: int = 0
    peak_cache_bytes: int = 0  # KV caches of every model the method runs (PeakCacheProbe)

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)


def run_side_by_side(
    methods: Sequence[MethodRun],
    tokenizer: Tokenizer,
    sources: Sequence[str],
    src_lang: str,
    tgt_lang: str,
    *,
    batch_size: int,
    desc: str = "",
) -> None:
    """Decodes `sources` with every method, batch by batch (sorted by length)."""
    decode = tokenizer.create_decoder(skip_special_tokens=True)
    prompt = target_prompt(tokenizer, tgt_lang)
    tokens = encode_sources(tokenizer, sources, src_lang)
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for m in methods:
        m.outputs, m.tokens = [""] * len(sources), [[] for _ in sources]
    # One probe for all, emptied after every call: methods share models, and a probe of
    # each would also count the calls of every other method on the same model.
    probe = PeakCacheProbe(model for m in methods for model in models(m.generator))
    try:
        for batch in tqdm(batches, desc=desc or f"batch {batch_size}", unit="batch"):
            src, src_layout = pad([tokens[i] for i in batch], 0)
            prompts, prompt_layout = pad([prompt] * len(batch), 0)
            for m in methods:
                started = time.perf_counter()
                out = m.generator(src, src_layout, prompts, prompt_layout)
                m.seconds.append(time.perf_counter() - started)
                for i, hyps in zip(batch, out.hypotheses, strict=True):
                    m.outputs[i] = decode(hyps[0].seq)
                    m.tokens[i] = [h.seq.tolist() for h in hyps]
                    m.generated_tokens += len(hyps[0].seq)
                if isinstance(out, SpeculativeGeneratorOutput):
                    m.stats.merge(out.stats)
                m.peak_cache_bytes = max(m.peak_cache_bytes, probe.take())
    finally:
        probe.close()


def models(generator: Seq2SeqGenerator) -> list[Module]:
    """The target, and the draft of a speculative generator."""
    draft = getattr(generator, "draft_model", None)
    return [generator.model] if draft is None else [generator.model, draft]
