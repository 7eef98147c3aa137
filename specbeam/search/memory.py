"""Memory budget of a speculative generation call: the bytes one source needs at the
peak, and the largest draft and number of sources at a time that fit a budget.

Counted: both KV caches at their largest (they grow up to `cache_capacity` positions,
the bound `_Op` gives them) and the largest logits of a pass in fp32 (the verification's
(T, V), the draft's per level). Left out, because they are small next to these for a
translation vocabulary: weights, encoder outputs, attention masks and hidden states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fairseq2.models.transformer import TransformerModel

from specbeam.kernels.runtime import MB


@dataclass(frozen=True)
class DecoderSize:
    position_bytes: int  # keys and values of one position of one hypothesis, all layers
    vocab_size: int

    @staticmethod
    def of(model: TransformerModel) -> DecoderSize:
        layers = list(model.decoder.layers)
        attn = layers[0].self_attn
        dtype = next(model.decoder.parameters()).dtype
        per_layer = 2 * attn.num_key_value_heads * attn.head_dim * dtype.itemsize
        return DecoderSize(len(layers) * per_layer, model.final_proj.output_dim)


def speculative_slots(k: int, prompt_len: int, depth: int, width: int) -> int:
    """New tokens per source in one verification: the hypotheses' pending chains (the
    whole prompt in the first pass) plus the draft tree."""
    return k * max(prompt_len, 2) + depth * width


def head_chain_len(prompt_len: int, depth: int) -> int:
    """A draft head's longest pending chain (its `prompt_len` for the functions here):
    the prompt and first token after the first pass, then up to depth + 1 accepted tokens."""
    return max(prompt_len + 1, depth + 1)


def cache_capacity(max_seq_len: int, prompt_len: int, k: int, depth: int, width: int) -> int:
    """Cache positions per hypothesis: the longest sequence plus one pass's slots."""
    return max_seq_len + -(-speculative_slots(k, prompt_len, depth, width) // k) + 1


def checked_increment(decode_capacity_increment: int | None) -> int | None:
    """The caches' growth step, as fairseq2's generators take it."""
    if decode_capacity_increment is not None and decode_capacity_increment < 1:
        raise ValueError(
            f"`decode_capacity_increment` must be ≥ 1 or None, but is {decode_capacity_increment}."
        )
    return decode_capacity_increment


@dataclass(frozen=True)
class SourceBytes:
    target_cache: int
    draft_cache: int
    logits: int

    @property
    def total(self) -> int:
        return self.target_cache + self.draft_cache + self.logits


def source_bytes(
    target: DecoderSize,
    draft: DecoderSize,
    *,
    k: int,
    prompt_len: int,
    max_seq_len: int,
    depth: int,
    width: int,
) -> SourceBytes:
    """Peak bytes of one source; a chunk of S sources needs S times as much."""
    positions = k * cache_capacity(max_seq_len, prompt_len, k, depth, width)
    verification = speculative_slots(k, prompt_len, depth, width) * target.vocab_size
    drafting = 3 * max(k, width) * draft.vocab_size  # logits, log-probs, cumulative scores
    return SourceBytes(
        target_cache=positions * target.position_bytes,
        draft_cache=positions * draft.position_bytes,
        logits=4 * (verification + drafting),
    )


@dataclass(frozen=True)
class Fit:
    depth: int
    width: int
    sources: int  # per chunk
    bytes_per_source: int


def fit_budget(
    budget: int,
    num_sources: int,
    need: Callable[[int, int], int],
    depth: int,
    width: int,
    min_width: int,
) -> Fit:
    """The deepest, then widest draft (down to depth 1, width `min_width`) with which one
    source's `need(depth, width)` bytes fit in `budget`, and how many sources fit at once.

    Chunking costs no exactness and little time; a smaller draft costs τ, so the draft
    shrinks only when a single source does not fit.
    """
    shapes = [(d, width) for d in range(depth, 0, -1)]
    shapes += [(1, w) for w in range(width - 1, min_width - 1, -1)]
    for d, w in shapes:
        per_source = need(d, w)
        if per_source <= budget:
            return Fit(d, w, min(num_sources, budget // per_source), per_source)
    least = need(1, min_width)
    raise ValueError(
        f"hardware.memory_budget_mb is too small: one source of this batch needs {least} "
        f"bytes ({least / MB:.3f} MB) even with gamma=1 and draft_width={min_width}, the "
        f"budget is {budget} bytes; raise it, or set it to 0 (unlimited)"
    )
