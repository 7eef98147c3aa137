"""A target's or a draft's training on a task, resumable and time-budgeted: the trainer
behind `python -m specbeam.train`."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sacrebleu
import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from omegaconf import OmegaConf
from torch import Tensor
from torch.nn.functional import cross_entropy, log_softmax, softmax
from tqdm import tqdm

from specbeam.data.batches import teacher_forcing, token_batches
from specbeam.data.inference import translate_texts
from specbeam.data.pairs import read_tsv
from specbeam.data.task import TaskConfig
from specbeam.data.tokens import tokenize_pairs
from specbeam.integration.models import (
    ModelArch,
    ModelPairConfig,
    atomic_save,
    build_model,
    build_shallow_draft,
    load_model,
    num_parameters,
    save_model,
)
from specbeam.plural import counted
from specbeam.training.teacher import TeacherTopK, load_or_compute

log = logging.getLogger("specbeam.train")


@dataclass(kw_only=True)
class TrainConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    arch: ModelArch = field(default_factory=ModelArch)
    tokenizer: str = "bible_es_en_target"
    """The asset card whose tokenizer the model is trained with."""
    out_dir: str = "~/.cache/specbeam/target"
    train_targets: str | None = None
    """A TSV whose targets replace the references (sequence-level distillation)."""
    shallow_over: str | None = None
    """A target checkpoint: train only a draft decoder (of `arch`'s size) that reads this
    target's frozen encoder."""
    kd_teacher: str | None = None
    """A target checkpoint to distil from token by token: the loss mixes the references'
    cross-entropy with the cross-entropy against the teacher's top-k distribution at
    every position. Teaches a draft the teacher's ranking, which exact speculative beam
    search needs (its top k, not only its top 1)."""
    kd_weight: float = 0.5
    """Share of the teacher's term in the loss."""
    kd_top_k: int = 16
    kd_cache: str | None = None
    """Where the teacher's top k are stored (default: out_dir/teacher_top<k>.pt); drafts
    trained on the same data can share one file."""
    max_tokens: int = 6000
    """Padded source + target tokens per batch."""
    lr: float = 8e-4
    warmup_steps: int = 500
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    max_epochs: int = 60
    time_budget_minutes: float = 0.0
    """Stop (with a checkpoint) after this much wall time in this run; 0 = no limit."""
    max_steps: int = 0
    """Stop (with a checkpoint) at this optimizer step, e.g. to average with an earlier
    checkpoint (`python -m specbeam.average`); 0 = no limit."""
    checkpoint_every_minutes: float = 10.0
    dev_sentences: int = 0
    """Greedy dev BLEU on the first n dev sentences per epoch; 0 = all."""
    threads: int = 2
    bf16: bool = True
    seed: int = 1


def distillation_loss(
    logits: Tensor,
    teacher_idx: Tensor,
    teacher_logp: Tensor,
    tgt_out: Tensor,
    pad_idx: int,
    label_smoothing: float,
    weight: float,
) -> Tensor:
    """Summed over target tokens: (1 - weight) label-smoothed cross-entropy with the
    references + weight cross-entropy against the teacher's top k, renormalised (its KL
    to the model up to a constant). logits: (N, T, V); teacher_*: (N, T, k)."""
    mask = tgt_out != pad_idx
    lprobs = log_softmax(logits.float(), dim=-1)[mask]  # (P, V)
    ce = cross_entropy(lprobs, tgt_out[mask], label_smoothing=label_smoothing, reduction="sum")
    soft = softmax(teacher_logp[mask], dim=-1)  # (P, k)
    kd = -(soft * lprobs.gather(-1, teacher_idx[mask])).sum()
    return (1 - weight) * ce + weight * kd


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir).expanduser()
        self.tokenizer = ModelPairConfig(tokenizer=cfg.tokenizer).load_tokenizer()
        self.pad_idx = self.tokenizer.vocab_info.pad_idx or 0
        train_pairs = cfg.task.split("train")
        if cfg.train_targets:
            train_pairs = read_tsv(Path(cfg.train_targets).expanduser())
        self.train = tokenize_pairs(
            train_pairs, self.tokenizer, cfg.task.src_lang, cfg.task.tgt_lang
        )
        self.dev_pairs = cfg.task.split("dev")[: cfg.dev_sentences or None]
        if cfg.shallow_over:
            target = load_model(Path(cfg.shallow_over).expanduser())
            target.requires_grad_(False)
            self.model = build_shallow_draft(target, cfg.arch)
        else:
            self.model = build_model(cfg.arch)
        self.teacher: TeacherTopK | None = None
        if cfg.kd_teacher:
            cache = Path(cfg.kd_cache or self.out / f"teacher_top{cfg.kd_top_k}.pt").expanduser()
            self.teacher = load_or_compute(
                cache, Path(cfg.kd_teacher).expanduser(), self.train, self.pad_idx,
                cfg.kd_top_k, bf16=cfg.bf16,
            )  # fmt: skip
        self.opt = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.lr,
            betas=(0.9, 0.98),
            weight_decay=cfg.weight_decay,
        )
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.history: list[dict] = []
        self.best_bleu = -1.0

    def train_mode(self) -> None:
        """Dropout on, except in a frozen shared encoder: it must give the states the
        draft will read at inference."""
        self.model.train()
        if self.cfg.shallow_over:
            self.model.encoder_frontend.eval()
            self.model.encoder.eval()

    def lr_at(self, step: int) -> float:
        warm = self.cfg.warmup_steps
        return self.cfg.lr * min(step / warm, math.sqrt(warm / max(step, 1)))

    def resume(self) -> None:
        last = self.out / "last.pt"
        if not last.exists():
            return
        ckpt = torch.load(last, map_location="cpu", weights_only=False)
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["opt"])
        self.step, self.epoch, self.batch_in_epoch = (
            ckpt["step"],
            ckpt["epoch"],
            ckpt["batch_in_epoch"],
        )
        self.history, self.best_bleu = ckpt["history"], ckpt["best_bleu"]
        log.info(
            "resumed from %s at epoch %d batch %d (step %d)",
            last,
            self.epoch + 1,
            self.batch_in_epoch,
            self.step,
        )

    def checkpoint(self) -> None:
        atomic_save(
            {
                "model": self.model.state_dict(),
                "opt": self.opt.state_dict(),
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "history": self.history,
                "best_bleu": self.best_bleu,
                "config": asdict(self.cfg)
                if not OmegaConf.is_config(self.cfg)
                else OmegaConf.to_container(self.cfg),
            },
            self.out / "last.pt",
        )

    def train_step(self, indices: list[int]) -> tuple[float, int]:
        batch = [self.train[i] for i in indices]
        src, src_layout, tgt_in, in_layout, tgt_out = teacher_forcing(batch, self.pad_idx)
        n_tokens = int((tgt_out != self.pad_idx).sum())
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(self.step + 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.bf16):
            if self.teacher is None:
                loss = self.model(
                    src,
                    src_layout,
                    tgt_in,
                    in_layout,
                    tgt_out,
                    label_smoothing=self.cfg.label_smoothing,
                )
            else:
                teacher_idx, teacher_logp = self.teacher.batch(indices, tgt_in.shape[1])
                logits = self.model(src, src_layout, tgt_in, in_layout)
                loss = distillation_loss(
                    logits, teacher_idx, teacher_logp, tgt_out, self.pad_idx,
                    self.cfg.label_smoothing, self.cfg.kd_weight,
                )  # fmt: skip
        self.opt.zero_grad(set_to_none=True)
        (loss / n_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.step += 1
        return float(loss.detach()) / n_tokens, n_tokens

    @torch.inference_mode()
    def dev_bleu(self) -> float:
        self.model.eval()
        generator = BeamSearchSeq2SeqGenerator(
            self.model, self.tokenizer.vocab_info, beam_size=1, max_gen_len=(1.5, 10)
        )
        hyps = translate_texts(
            generator, self.tokenizer, [p.source for p in self.dev_pairs],
            self.cfg.task.src_lang, self.cfg.task.tgt_lang, max_tokens=4096,
        )  # fmt: skip
        self.train_mode()
        return sacrebleu.corpus_bleu(hyps, [[p.target for p in self.dev_pairs]]).score

    def end_epoch(self, epoch_loss: float, epoch_seconds: float) -> None:
        bleu = self.dev_bleu()
        entry = {"epoch": self.epoch + 1, "step": self.step, "train_loss": epoch_loss,
                 "dev_bleu_greedy": bleu, "epoch_seconds": epoch_seconds}  # fmt: skip
        self.history.append(entry)
        log.info("epoch %d: %s", self.epoch + 1, json.dumps(entry))
        if bleu > self.best_bleu:
            self.best_bleu = bleu
            save_model(
                self.model, self.cfg.arch, self.out / "best.pt", torch.float32,
                shares_encoder=bool(self.cfg.shallow_over),
            )  # fmt: skip
        (self.out / "history.json").write_text(json.dumps(self.history, indent=1) + "\n")
        self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def run(self) -> None:
        cfg = self.cfg
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.resume()
        log.info(
            "model: %s parameters; %s",
            f"{num_parameters(self.model):,}",
            counted(len(self.train), "training pair"),
        )
        if cfg.max_steps and self.step >= cfg.max_steps:
            log.info("already at step %d (max_steps=%d): nothing to do", self.step, cfg.max_steps)
            return
        self.train_mode()
        started = last_ckpt = time.monotonic()
        lengths = [len(p.source) + len(p.target) for p in self.train]
        while self.epoch < cfg.max_epochs:
            batches = token_batches(lengths, cfg.max_tokens, seed=cfg.seed + self.epoch)
            bar = tqdm(
                batches[self.batch_in_epoch :], desc=f"epoch {self.epoch + 1}", mininterval=30
            )
            total_loss = total_tokens = 0.0
            epoch_started = time.monotonic()
            for indices in bar:
                loss, n = self.train_step(indices)
                self.batch_in_epoch += 1
                total_loss, total_tokens = total_loss + loss * n, total_tokens + n
                bar.set_postfix(
                    loss=f"{loss:.3f}", lr=f"{self.lr_at(self.step):.2e}", refresh=False
                )
                now = time.monotonic()
                if now - last_ckpt > cfg.checkpoint_every_minutes * 60:
                    self.checkpoint()
                    last_ckpt = now
                out_of_time = (
                    cfg.time_budget_minutes and now - started > cfg.time_budget_minutes * 60
                )
                if out_of_time or (cfg.max_steps and self.step >= cfg.max_steps):
                    self.checkpoint()
                    log.info(
                        "%s reached at epoch %d batch %d (step %d)",
                        "time budget" if out_of_time else "max_steps",
                        self.epoch + 1,
                        self.batch_in_epoch,
                        self.step,
                    )
                    return
            self.end_epoch(total_loss / max(total_tokens, 1), time.monotonic() - epoch_started)
            self.checkpoint()
            last_ckpt = time.monotonic()
