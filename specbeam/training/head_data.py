"""A draft head's training data: the target's own states and next-token distributions at
every position of its translations, computed once (teacher forcing) and stored.

The head learns to predict the target's next state and distribution from the target's
previous state; both come from one target pass over the data, which on this CPU costs
about as much as an epoch of the head. The target's encoder output is stored too: the
head's cross-attention reads it. Rows are in fp16 (the head drafts in bf16). With
`feature_layers` (a head over several layers, EAGLE-3) a state row also holds those
layers' outputs, before the final state; a head over fewer layers reads a subset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from fairseq2.models.transformer import TransformerModel
from fairseq2.nn import BatchLayout
from torch import Tensor
from tqdm import tqdm

from specbeam.data.batches import teacher_forcing, token_batches
from specbeam.data.tokens import TokenizedPair
from specbeam.integration.models import atomic_save
from specbeam.search.head import check_feature_layers
from specbeam.search.tree_attention import tapping
from specbeam.training.teacher import fingerprint

log = logging.getLogger("specbeam.train_head")


@dataclass(frozen=True)
class HeadBatch:
    tokens: Tensor  # (N, T) decoder inputs, padded
    lens: list[int]  # (N,) valid positions per row
    states: Tensor  # (N, T, F) the target's layer outputs, then its final states
    top_idx: Tensor  # (N, T, k) the target's best next tokens
    top_logp: Tensor  # (N, T, k) their log-probabilities
    encoder: Tensor  # (N, S, M) the target's encoder output
    source_layout: BatchLayout
    prompt_len: int  # leading tokens of every row that generation starts from

    @property
    def final_states(self) -> Tensor:
        """(N, T, M) the target's decoder outputs after its final norm."""
        return self.states[..., -self.encoder.size(-1) :]


@dataclass(frozen=True)
class HeadData:
    """Pair i holds target positions tgt_offsets[i]:[i + 1] of `tokens`, `states` and
    the top k, and source positions src_offsets[i]:[i + 1] of `encoder`."""

    tokens: Tensor  # (P,) int64
    states: Tensor  # (P, (len(feature_layers) + 1) M) float16
    top_idx: Tensor  # (P, k) int32
    top_logp: Tensor  # (P, k) float16
    tgt_offsets: Tensor  # (n + 1,) int64
    encoder: Tensor  # (Q, M) float16
    src_offsets: Tensor  # (n + 1,) int64
    prompt_len: int
    feature_layers: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tgt_offsets) - 1

    def select(self, layers: tuple[int, ...]) -> HeadData:
        """The same data with the states of `layers` (a subset of `feature_layers`)
        and the final state only."""
        if layers == self.feature_layers:
            return self
        dim = self.encoder.size(-1)
        blocks = [self.feature_layers.index(i) for i in layers] + [len(self.feature_layers)]
        states = torch.cat([self.states[:, b * dim : (b + 1) * dim] for b in blocks], dim=1)
        return replace(self, states=states, feature_layers=layers)

    def lengths(self) -> list[int]:
        """Source + target positions per pair, for token batches."""
        return (self.tgt_offsets.diff() + self.src_offsets.diff()).tolist()

    def batch(self, rows: Sequence[int], pad_idx: int) -> HeadBatch:
        tgt = [(int(self.tgt_offsets[i]), int(self.tgt_offsets[i + 1])) for i in rows]
        src = [(int(self.src_offsets[i]), int(self.src_offsets[i + 1])) for i in rows]
        lens, src_lens = [e - s for s, e in tgt], [e - s for s, e in src]
        n, length, source_len = len(rows), max(lens), max(src_lens)
        k = self.top_idx.size(1)
        tokens = torch.full((n, length), pad_idx, dtype=torch.int64)
        states = torch.zeros((n, length, self.states.size(1)))
        top_idx = torch.zeros((n, length, k), dtype=torch.int64)
        top_logp = torch.zeros((n, length, k))
        encoder = torch.zeros((n, source_len, self.encoder.size(1)))
        for r, ((s, e), (a, b)) in enumerate(zip(tgt, src, strict=True)):
            tokens[r, : e - s] = self.tokens[s:e]
            states[r, : e - s] = self.states[s:e]
            top_idx[r, : e - s] = self.top_idx[s:e]
            top_logp[r, : e - s] = self.top_logp[s:e]
            encoder[r, : b - a] = self.encoder[a:b]
        layout = BatchLayout.of(encoder, src_lens)
        return HeadBatch(tokens, lens, states, top_idx, top_logp, encoder, layout, self.prompt_len)


@torch.inference_mode()
def compute_head_data(
    target: TransformerModel,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    *,
    prompt_len: int,
    max_tokens: int = 6000,
    bf16: bool = True,
    feature_layers: tuple[int, ...] = (),
) -> HeadData:
    """`prompt_len`: the targets' leading tokens that generation starts from;
    `feature_layers` ascending, the order the layers run and a head reads them."""
    feature_layers = check_feature_layers(feature_layers, target)
    tgt_lens = torch.tensor([len(p.target) - 1 for p in pairs])
    src_lens = torch.tensor([len(p.source) for p in pairs])
    tgt_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), tgt_lens.cumsum(0)])
    src_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), src_lens.cumsum(0)])
    dim, positions = target.model_dim, int(tgt_offsets[-1])
    data = HeadData(
        tokens=torch.zeros(positions, dtype=torch.int64),
        states=torch.zeros((positions, (len(feature_layers) + 1) * dim), dtype=torch.float16),
        top_idx=torch.zeros((positions, k), dtype=torch.int32),
        top_logp=torch.zeros((positions, k), dtype=torch.float16),
        tgt_offsets=tgt_offsets,
        encoder=torch.zeros((int(src_offsets[-1]), dim), dtype=torch.float16),
        src_offsets=src_offsets,
        prompt_len=prompt_len,
        feature_layers=feature_layers,
    )
    with tapping(target.decoder, feature_layers) as tapped:
        _fill(data, target, pairs, pad_idx, k, tapped, max_tokens, bf16)
    return data


def _fill(
    data: HeadData,
    target: TransformerModel,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    tapped: list[Tensor],
    max_tokens: int,
    bf16: bool,
) -> None:
    """Runs the target over `pairs` in token batches and stores its rows in `data`."""
    tgt_offsets, src_offsets = data.tgt_offsets, data.src_offsets
    batches = token_batches([len(p.source) + len(p.target) for p in pairs], max_tokens)
    for batch in tqdm(batches, desc="target states", unit="batch", mininterval=30):
        src, src_layout, tgt_in, in_layout, _ = teacher_forcing([pairs[i] for i in batch], pad_idx)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            enc = target.encoder(*target.encoder_frontend(src, src_layout))
            x, layout = target.decoder_frontend(tgt_in, in_layout)
            final = target.decoder(x, layout, enc, src_layout)
            logits = target.final_proj(final)
            states = torch.cat([*tapped, final], dim=-1)
            tapped.clear()
        top = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
        for n, i in enumerate(batch):
            t = slice(int(tgt_offsets[i]), int(tgt_offsets[i + 1]))
            s = slice(int(src_offsets[i]), int(src_offsets[i + 1]))
            length = t.stop - t.start
            data.tokens[t] = tgt_in[n, :length]
            data.states[t] = states[n, :length].to(torch.float16)
            data.top_idx[t] = top.indices[n, :length].to(torch.int32)
            data.top_logp[t] = top.values[n, :length].to(torch.float16)
            data.encoder[s] = enc[n, : s.stop - s.start].to(torch.float16)


def load_or_compute(
    path: Path,
    target_path: Path,
    target: TransformerModel,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    *,
    prompt_len: int,
    bf16: bool = True,
    feature_layers: tuple[int, ...] = (),
) -> HeadData:
    """Reuses `path` when it was computed from the same data, target (`target_path`, the
    checkpoint `target` was loaded from) and k, over the layers `feature_layers` or more;
    a stale file is recomputed, never silently used."""
    key = fingerprint(pairs, target_path, k) + f":{prompt_len}"
    if path.exists():
        saved = torch.load(path, weights_only=True)
        saved["feature_layers"] = tuple(saved.get("feature_layers", ()))
        fits = set(feature_layers) <= set(saved["feature_layers"])
        if saved.pop("fingerprint") == key and fits:
            log.info("target states and top-%d from %s", k, path)
            return HeadData(**saved).select(feature_layers)
        log.warning("%s was computed from other data, target, k or fewer layers: recomputing", path)
    data = compute_head_data(
        target, pairs, pad_idx, k, prompt_len=prompt_len, bf16=bf16, feature_layers=feature_layers
    )
    atomic_save({"fingerprint": key, **data.__dict__}, path)
    return data
