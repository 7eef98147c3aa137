"""A teacher's top-k next-token distributions over a training set, computed once.

Token-level distillation needs the teacher's distribution at every target position. On
this CPU the teacher's forward pass costs more than a small draft's whole training step,
so running it per batch and per epoch would more than double training time; its top k
are stored instead, once for every epoch and every draft trained on the same data (k = 16
holds 90% of the shipped target's probability on average over its distillation data,
median 93%).

    python -m specbeam.teacher ~/.cache/specbeam/target_final.pt \
        ~/.cache/specbeam/distill/train.tsv ~/.cache/specbeam/distill/teacher_top16.pt

computes the file that `python -m specbeam.train kd_teacher=... kd_cache=...` then reads
(training computes it itself when it is missing, with the training run's threads).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from fairseq2.models.transformer import TransformerModel
from torch import Tensor
from tqdm import tqdm

from specbeam.data.batches import teacher_forcing, token_batches
from specbeam.data.pairs import read_tsv
from specbeam.data.task import TaskConfig
from specbeam.data.tokens import TokenizedPair, tokenize_pairs
from specbeam.integration.models import ModelPairConfig, atomic_save, load_model

log = logging.getLogger("specbeam.teacher")


def fingerprint(pairs: Sequence[TokenizedPair], teacher: Path, k: int) -> str:
    """Identifies the data (every token), the teacher checkpoint (size and mtime) and k."""
    h = hashlib.sha256()
    for p in pairs:
        h.update(p.source.numpy().tobytes())
        h.update(b"|")
        h.update(p.target.numpy().tobytes())
    stat = teacher.stat()
    h.update(f"{teacher.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{k}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class TeacherTopK:
    """Pair i's positions are rows offsets[i]:offsets[i + 1] (one per target input token)."""

    indices: Tensor  # (P, k) int32 token ids, best first
    logprobs: Tensor  # (P, k) float16 log-probabilities
    offsets: Tensor  # (n + 1,) int64

    def batch(self, rows: Sequence[int], length: int) -> tuple[Tensor, Tensor]:
        """Padded to `length` positions: (N, length, k) int64 ids and float32 log-probs;
        padding rows are never read (the loss masks them)."""
        k = self.indices.shape[1]
        idx = torch.zeros((len(rows), length, k), dtype=torch.int64)
        logp = torch.zeros((len(rows), length, k))
        for n, i in enumerate(rows):
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            idx[n, : end - start] = self.indices[start:end]
            logp[n, : end - start] = self.logprobs[start:end]
        return idx, logp


@torch.inference_mode()
def compute_teacher_topk(
    teacher: TransformerModel,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    *,
    max_tokens: int = 6000,
    bf16: bool = True,
) -> TeacherTopK:
    lengths = [len(p.target) - 1 for p in pairs]
    offsets = torch.zeros(len(pairs) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    indices = torch.zeros((int(offsets[-1]), k), dtype=torch.int32)
    logprobs = torch.zeros((int(offsets[-1]), k), dtype=torch.float16)
    batches = token_batches([len(p.source) + len(p.target) for p in pairs], max_tokens)
    for batch in tqdm(batches, desc=f"teacher top-{k}", unit="batch", mininterval=30):
        src, src_layout, tgt_in, in_layout, _ = teacher_forcing([pairs[i] for i in batch], pad_idx)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = teacher(src, src_layout, tgt_in, in_layout)
        top = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)  # (N, T, k)
        for n, i in enumerate(batch):
            rows = slice(int(offsets[i]), int(offsets[i + 1]))
            indices[rows] = top.indices[n, : lengths[i]].to(torch.int32)
            logprobs[rows] = top.values[n, : lengths[i]].to(torch.float16)
    return TeacherTopK(indices, logprobs, offsets)


def load_or_compute(
    path: Path,
    teacher_path: Path,
    pairs: Sequence[TokenizedPair],
    pad_idx: int,
    k: int,
    *,
    bf16: bool = True,
) -> TeacherTopK:
    """Reuses `path` when it was computed from the same data, teacher and k; a stale file
    is recomputed, never silently used."""
    key = fingerprint(pairs, teacher_path, k)
    if path.exists():
        saved = torch.load(path, weights_only=True)
        if saved["fingerprint"] == key:
            log.info("teacher top-%d from %s", k, path)
            return TeacherTopK(saved["indices"], saved["logprobs"], saved["offsets"])
        log.warning("%s was computed from other data, teacher or k: recomputing", path)
    teacher = load_model(teacher_path).eval()
    topk = compute_teacher_topk(teacher, pairs, pad_idx, k, bf16=bf16)
    atomic_save(
        {"fingerprint": key, "indices": topk.indices, "logprobs": topk.logprobs,
         "offsets": topk.offsets},
        path,
    )  # fmt: skip
    return topk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("teacher", type=Path, help="the teacher's checkpoint")
    parser.add_argument("pairs", type=Path, help="the training TSV (ref, source, target)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(args.threads)
    task = TaskConfig()
    tokenizer = ModelPairConfig().load_tokenizer()
    pairs = tokenize_pairs(read_tsv(args.pairs), tokenizer, task.src_lang, task.tgt_lang)
    load_or_compute(args.out, args.teacher, pairs, tokenizer.vocab_info.pad_idx or 0, args.k)
