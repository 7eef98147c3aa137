"""A draft head's training (`specbeam/search/head.py`) on the target's own translations:
the trainer behind `python -m specbeam.train_head`.

The target's states and top-k distributions are computed once (`head_data.py`). Each
position is trained for `unroll` drafting steps: step 0 reads the target's state of the
parent, step j > 0 the head's own state from step j - 1, attending to the target-fed
keys of the prefix and its own keys of the steps between (the training-time test of
HASS and EAGLE-3), so that training sees what drafting feeds the head. The loss is the
cross-entropy against the target's top k (HASS's top-K distillation) plus a smooth-L1
pull of the predicted state towards the target's (EAGLE).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib
import torch
from fairseq2.assets import AssetStore
from fairseq2.models.transformer import TransformerModel
from torch import Tensor
from torch.nn.functional import log_softmax, smooth_l1_loss, softmax
from tqdm import tqdm

from specbeam.data.batches import token_batches
from specbeam.data.pairs import read_tsv
from specbeam.data.task import TaskConfig
from specbeam.data.tokens import target_prompt_len, tokenize_pairs
from specbeam.integration.hub import asset_store, is_path, retrieve_card
from specbeam.integration.models import (
    TargetConfig,
    atomic_save,
    load_model,
    load_target,
    save_head,
)
from specbeam.kernels.lean_decoder import (
    KeysWith,
    cross_keys,
    decoder_layer,
    final_norm,
    lean_problem,
    padding_bias,
)
from specbeam.paths import user_path
from specbeam.plural import counted
from specbeam.search.head import DraftHead, HeadArch
from specbeam.search.tree_attention import embed_at
from specbeam.training import head_data
from specbeam.training.head_data import HeadBatch, HeadData

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

log = logging.getLogger("specbeam.train_head")


@dataclass(kw_only=True)
class TrainHeadConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: TargetConfig = field(default_factory=TargetConfig)
    """The target the head drafts for (`model.target=`: an asset card or a checkpoint)."""
    data: str = "~/.cache/specbeam/distill/train.tsv"
    """The target's translations of the training sources (`python -m specbeam.distill`)."""
    data_cache: str = "~/.cache/specbeam/distill/head_states.pt"
    """Where the target's states and top k over `data` are stored (computed if missing)."""
    out_dir: str = "~/.cache/specbeam/head"
    """Where last.pt (which a rerun resumes from), best.pt, history.json and curves.png
    are written."""
    num_layers: int = 1
    """The head's decoder layers, initialised from the target's last ones; `init` overrides it."""
    feature_layers: list[int] = field(default_factory=list)
    """The target's lower decoder layers the head also reads (EAGLE-3; `head.py`)."""
    init: str = ""
    """A head checkpoint to start from (e.g. tasks/bible_es_en/models/head.pt: more data
    for the shipped head), in place of the target's last layer; its layer count wins.
    A head over the final state alone may start a head over `feature_layers` too: its
    fusion then starts as the choice of the final state. A run that resumes from
    `out_dir` ignores it."""
    top_k: int = 16
    """The target's k most likely tokens per position, whose renormalised distribution the
    head learns by cross-entropy (HASS's top-K distillation)."""
    unroll: int = 3
    """Drafting steps trained per position (the depth the head drafts to)."""
    state_weight: float = 0.5
    """Weight of the smooth-L1 loss on the predicted states."""
    max_tokens: int = 4000
    """Padded source + target tokens per batch."""
    lr: float = 5e-4
    """Peak AdamW learning rate, reached at `warmup_steps`, then decaying as 1/√step."""
    warmup_steps: int = 200
    """Optimizer steps of linear warm-up to `lr`."""
    clip_norm: float = 1.0
    """Gradients are clipped to this total norm."""
    max_epochs: int = 10
    """Epochs over the training pairs in all (a resumed run continues up to this many)."""
    time_budget_minutes: float = 0.0
    """Stop (with a checkpoint) after this much wall time in this run; 0 = no limit."""
    checkpoint_every_minutes: float = 10.0
    """Wall-clock minutes between checkpoints (`last.pt`), besides one after each epoch."""
    valid_pairs: int = 500
    """Pairs held out (a fixed random choice) for the validation metrics; at most a tenth
    of the data (at least 1), so a small corpus holds out fewer."""
    valid_every_steps: int = 250
    """Optimizer steps between validations (one also ends each epoch); each saves best.pt
    when it is the best so far."""
    threads: int = 2
    """CPU threads torch runs on (`torch.set_num_threads`)."""
    bf16: bool = True
    """Run the target (computing `data_cache`) and the head's training under bf16 autocast;
    false: fp32."""
    seed: int = 1
    """Seeds the held-out choice, each epoch's batch order and torch's generator."""


def unrolled_states(head: DraftHead, batch: HeadBatch, unroll: int) -> list[Tensor]:
    """The head's predicted states (N, T, M) at every position, per drafting step."""
    tokens = batch.tokens
    n, length = tokens.shape
    positions = torch.arange(length)
    embedded = embed_at(head.decoder_frontend, tokens, positions.expand(n, length))
    layers = list(head.decoder.layers)
    cross = [cross_keys(layer.encoder_decoder_attn, batch.encoder) for layer in layers]
    cross_bias = padding_bias(
        batch.source_layout.seq_lens, batch.encoder.size(1), embedded.dtype, tokens.device
    )
    past: list[list[tuple[Tensor, Tensor]]] = [[] for _ in layers]
    # No target state precedes a prompt token: the target has not run when the head
    # drafts the first tree.
    parent = _shift(batch.states)
    parent[:, : batch.prompt_len] = 0
    parent = head.fuse_features(parent)
    out = []
    for j in range(unroll):
        # Step j at position t drafts below the root at t - j: the prefix up to the root
        # is keyed by step 0 (the target's states), position t - j + i by step i.
        t, s = positions[:, None], positions[None, :]
        visible = torch.cat([s <= t - j, *[s == t - j + i for i in range(1, j + 1)]], dim=1)
        bias = torch.zeros(visible.shape, dtype=embedded.dtype).masked_fill_(~visible, -torch.inf)
        x = head.read_features(embedded, parent)
        for layer, keys, kv in zip(layers, past, cross, strict=True):
            x = decoder_layer(layer, x, _across_steps(keys), bias[None, None], kv, cross_bias)
        out.append(final_norm(head.decoder, x))
        parent = _shift(out[-1])
    return out


def _shift(states: Tensor) -> Tensor:
    """Each position reads its parent's state: the one before it (zero for the first)."""
    return torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], dim=1)


def _across_steps(keys: list[tuple[Tensor, Tensor]]) -> KeysWith:
    def keys_with(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        keys.append((k, v))
        return torch.cat([a for a, _ in keys], dim=1), torch.cat([b for _, b in keys], dim=1)

    return keys_with


@dataclass
class StepMetrics:
    """Sums over the valid positions of one drafting step."""

    positions: int = 0
    loss: float = 0.0
    top1: int = 0  # the head's best token is the target's
    top5_in_10: int = 0  # the target's 5 best are all in the head's 10 best

    def add(self, other: StepMetrics) -> None:
        self.positions += other.positions
        self.loss += other.loss
        self.top1 += other.top1
        self.top5_in_10 += other.top5_in_10

    def summary(self) -> dict[str, float]:
        n = max(self.positions, 1)
        return {"loss": self.loss / n, "top1": self.top1 / n, "top5_in_10": self.top5_in_10 / n}


def head_loss(
    head: DraftHead, batch: HeadBatch, unroll: int, state_weight: float
) -> tuple[Tensor, list[StepMetrics]]:
    """Summed over valid positions and steps. Step j at position t drafts below the root
    at t - j, which is the prompt's last token or later."""
    total, metrics = torch.zeros(()), []
    lens = torch.tensor(batch.lens)
    positions = torch.arange(batch.tokens.size(1))
    target_probs = softmax(batch.top_logp, dim=-1)  # renormalised top k
    for j, states in enumerate(unrolled_states(head, batch, unroll)):
        valid = (positions[None, :] >= j + batch.prompt_len - 1) & (
            positions[None, :] < lens[:, None]
        )
        lprobs = log_softmax(head.final_proj(states[valid]).float(), dim=-1)  # (P, V)
        top_idx = batch.top_idx[valid]
        kd = -(target_probs[valid] * lprobs.gather(-1, top_idx)).sum()
        pull = smooth_l1_loss(states[valid].float(), batch.final_states[valid], reduction="sum")
        loss = kd + state_weight * pull / states.size(-1)
        total = total + loss
        with torch.no_grad():
            best10 = lprobs.topk(10, dim=-1).indices
            covered = (top_idx[:, :5, None] == best10[:, None, :]).any(-1).all(-1)
            metrics.append(
                StepMetrics(
                    int(valid.sum()),
                    float(loss),
                    int((best10[:, 0] == top_idx[:, 0]).sum()),
                    int(covered.sum()),
                )
            )
    return total, metrics


class HeadTrainer:
    def __init__(self, cfg: TrainHeadConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir).expanduser()
        store = asset_store(cfg.model.asset_dirs)
        tokenizer = cfg.model.load_tokenizer(store)
        self.pad_idx = tokenizer.vocab_info.pad_idx or 0
        data_path = Path(cfg.data).expanduser()
        if not data_path.exists():
            raise FileNotFoundError(
                f"{data_path}: the target's translations of the training sources are missing; "
                f"`python -m specbeam.distill model.target={cfg.model.target} model.draft=none "
                "decoding=beam` makes them (the embedded pair's: `tasks/bible_es_en/build.sh` "
                "step `distill`)"
            )
        pairs = tokenize_pairs(read_tsv(data_path), tokenizer, cfg.task.src_lang, cfg.task.tgt_lang)
        target = load_target(cfg.model.target, store)
        problem = lean_problem(target.decoder)
        if problem is not None:
            raise ValueError(
                f"model.target={cfg.model.target}: a draft head trains on the lean decoder, "
                f"which cannot run this target's ({problem})"
                + (
                    ": a head needs pre-norm layers, as NLLB's are"
                    if "norm order" in problem
                    else ""
                )
            )
        num_valid = held_out(len(pairs), cfg.valid_pairs, data_path)
        target.requires_grad_(False)
        self.data: HeadData = head_data.load_or_compute(
            Path(cfg.data_cache).expanduser(), checkpoint_file(cfg.model.target, store), target, pairs,
            self.pad_idx, cfg.top_k,
            prompt_len=target_prompt_len(tokenizer, cfg.task.tgt_lang), bf16=cfg.bf16,
            feature_layers=tuple(cfg.feature_layers),
        )  # fmt: skip
        order = list(range(len(self.data)))
        random.Random(cfg.seed).shuffle(order)
        self.valid_rows = sorted(order[:num_valid])
        self.train_rows = sorted(order[num_valid:])
        layers = tuple(cfg.feature_layers)
        if cfg.init:
            self.head = init_head(user_path(cfg.init), target, layers)
        else:
            self.head = DraftHead(
                target, HeadArch(num_layers=cfg.num_layers, feature_layers=layers)
            )
        self.head.requires_grad_(False)
        for p in self.head.own_parameters():
            p.requires_grad_(True)
        self.head.eval()  # no dropout: the target's states are what drafting reads
        self.opt = torch.optim.AdamW(self.head.own_parameters(), lr=cfg.lr, betas=(0.9, 0.98))
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.history: list[dict] = []
        self.best: tuple[float, ...] | None = None  # head_score of best.pt

    def lr_at(self, step: int) -> float:
        warm = self.cfg.warmup_steps
        return self.cfg.lr * min(step / warm, math.sqrt(warm / max(step, 1)))

    def resume(self) -> None:
        last = self.out / "last.pt"
        if not last.exists():
            return
        ckpt = torch.load(last, map_location="cpu", weights_only=False)
        self.head.load_state_dict(ckpt["head"], strict=False)
        self.opt.load_state_dict(ckpt["opt"])
        self.step, self.epoch, self.batch_in_epoch = (
            ckpt["step"],
            ckpt["epoch"],
            ckpt["batch_in_epoch"],
        )
        self.history = ckpt["history"]
        self.best = max((head_score(h["valid"]) for h in self.history), default=None)
        log.info(
            "resumed from %s at epoch %d batch %d (step %d)",
            last, self.epoch + 1, self.batch_in_epoch, self.step,
        )  # fmt: skip

    def checkpoint(self) -> None:
        atomic_save(
            {
                "head": self.head.own_state_dict(),
                "opt": self.opt.state_dict(),
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "history": self.history,
                "config": asdict(self.cfg),
            },
            self.out / "last.pt",
        )

    def train_step(self, rows: list[int]) -> list[StepMetrics]:
        batch = self.data.batch(rows, self.pad_idx)
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(self.step + 1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.bf16):
            loss, metrics = head_loss(self.head, batch, self.cfg.unroll, self.cfg.state_weight)
        self.opt.zero_grad(set_to_none=True)
        (loss / max(metrics[0].positions, 1)).backward()
        torch.nn.utils.clip_grad_norm_(self.head.own_parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.step += 1
        return metrics

    @torch.no_grad()
    def validate(self, train: list[StepMetrics]) -> None:
        totals = [StepMetrics() for _ in range(self.cfg.unroll)]
        lengths = self.data.lengths()
        batches = token_batches([lengths[i] for i in self.valid_rows], self.cfg.max_tokens)
        for batch_rows in batches:
            batch = self.data.batch([self.valid_rows[i] for i in batch_rows], self.pad_idx)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cfg.bf16):
                _, metrics = head_loss(self.head, batch, self.cfg.unroll, self.cfg.state_weight)
            for total, m in zip(totals, metrics, strict=True):
                total.add(m)
        entry = {
            "step": self.step,
            "epoch": self.epoch + self.batch_in_epoch / max(self._batches_per_epoch, 1),
            "train": [m.summary() for m in train],
            "valid": [m.summary() for m in totals],
        }
        self.history.append(entry)
        log.info("step %d: %s", self.step, json.dumps(entry))
        score = head_score(entry["valid"])
        if self.best is None or score > self.best:
            self.best = score
            save_head(self.head, self.out / "best.pt", torch.float32)
        (self.out / "history.json").write_text(json.dumps(self.history, indent=1) + "\n")
        plot_curves(self.history, self.out / "curves.png")

    def run(self) -> None:
        torch.set_num_threads(self.cfg.threads)
        torch.manual_seed(self.cfg.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        self.resume()
        own = sum(p.numel() for p in self.head.own_parameters())
        log.info(
            "head: %s parameters of its own; %s",
            f"{own:,}", counted(len(self.train_rows), "training pair"),
        )  # fmt: skip
        self.train_epochs()
        self.report_best()

    def report_best(self) -> None:
        """Where the best head is, and why it is the best: the first validation with the
        highest score (the one `validate` saved)."""
        if not self.history:
            return
        best = max(self.history, key=lambda h: head_score(h["valid"]))
        cover = ", ".join(f"{m['top5_in_10']:.3f}" for m in best["valid"][:2])
        log.info(
            "best head: %s (step %d; held out, the target's top 5 within its top 10 at "
            "depths 1-2: %s)",
            self.out / "best.pt", best["step"], cover,
        )  # fmt: skip

    def train_epochs(self) -> None:
        cfg = self.cfg
        if self.epoch >= cfg.max_epochs:
            log.info("already at max_epochs=%d: nothing to do", cfg.max_epochs)
            return
        started = last_ckpt = time.monotonic()
        lengths = self.data.lengths()
        train_lengths = [lengths[i] for i in self.train_rows]
        self._batches_per_epoch = 0
        while self.epoch < cfg.max_epochs:
            batches = token_batches(train_lengths, cfg.max_tokens, seed=cfg.seed + self.epoch)
            self._batches_per_epoch = len(batches)
            bar = tqdm(
                batches[self.batch_in_epoch :], desc=f"head epoch {self.epoch + 1}", mininterval=30
            )
            running = [StepMetrics() for _ in range(cfg.unroll)]
            for batch_rows in bar:
                metrics = self.train_step([self.train_rows[i] for i in batch_rows])
                self.batch_in_epoch += 1
                for total, m in zip(running, metrics, strict=True):
                    total.add(m)
                bar.set_postfix(loss=f"{running[0].summary()['loss']:.3f}", refresh=False)
                if self.step % cfg.valid_every_steps == 0:
                    self.validate(running)
                    running = [StepMetrics() for _ in range(cfg.unroll)]
                now = time.monotonic()
                if now - last_ckpt > cfg.checkpoint_every_minutes * 60:
                    self.checkpoint()
                    last_ckpt = now
                if cfg.time_budget_minutes and now - started > cfg.time_budget_minutes * 60:
                    self.validate(running)
                    self.checkpoint()
                    log.info(
                        "time budget reached at epoch %d batch %d (step %d)",
                        self.epoch + 1, self.batch_in_epoch, self.step,
                    )  # fmt: skip
                    return
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self.validate(running)
            self.checkpoint()
            last_ckpt = time.monotonic()


def head_score(valid: list[dict]) -> tuple[float, float, float]:
    """What exact beam search needs of a head, from a validation's per-depth summaries:
    the target's top 5 inside the drafted top 10, at depths 1 and 2. Ties (a short run
    whose heads cover nothing yet) go to top-1 agreement, then to the lower loss."""
    first = valid[:2]
    return (
        sum(m["top5_in_10"] for m in first),
        sum(m["top1"] for m in first),
        -sum(m["loss"] for m in first),
    )


def held_out(num_pairs: int, valid_pairs: int, data: Path) -> int:
    """How many of `num_pairs` pairs validate: `valid_pairs`, but at most a tenth of them
    (at least 1), so that a small corpus still trains on most of its pairs."""
    if valid_pairs < 1:
        raise ValueError(f"valid_pairs={valid_pairs} is invalid: must be ≥ 1")
    if num_pairs < 2:
        raise ValueError(
            f"{data} has {counted(num_pairs, 'pair')}: a head needs at least 2, one to "
            "train on and one to hold out"
        )
    num_valid = min(valid_pairs, max(1, num_pairs // 10))
    log.info(
        "holding out %s of %d for validation%s",
        counted(num_valid, "pair"), num_pairs,
        "" if num_valid == valid_pairs else f" (valid_pairs={valid_pairs}: at most a tenth)",
    )  # fmt: skip
    return num_valid


def plot_curves(history: list[dict], path: Path) -> None:
    """Validation top-1 and top-5-in-10 per drafting step against training steps."""
    fig, (top1_ax, cover_ax) = plt.subplots(1, 2, figsize=(10, 4))
    steps = [h["step"] for h in history]
    for j in range(len(history[0]["valid"])):
        top1_ax.plot(steps, [h["valid"][j]["top1"] for h in history], "o-", label=f"depth {j + 1}")
        cover_ax.plot(
            steps, [h["valid"][j]["top5_in_10"] for h in history], "o-", label=f"depth {j + 1}"
        )
    top1_ax.set(xlabel="step", ylabel="top-1 agreement with the target (held out)")
    cover_ax.set(xlabel="step", ylabel="target's top 5 within the head's top 10")
    for ax in (top1_ax, cover_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def init_head(path: Path, target: TransformerModel, layers: tuple[int, ...]) -> DraftHead:
    """The head of checkpoint `path` over `target`, widened to read `layers` too."""
    head = load_model(path, target=target)
    if not isinstance(head, DraftHead):
        raise ValueError(f"init={path} is not a draft head")
    if head.feature_layers != layers:
        if head.feature_layers:
            raise ValueError(
                f"init={path} reads layers {list(head.feature_layers)}, not feature_layers="
                f"{list(layers)}; only a head over the final state alone can start another"
            )
        wider = DraftHead(target, HeadArch(num_layers=head.arch.num_layers, feature_layers=layers))
        wider.load_state_dict(head.own_state_dict(), strict=False)
        wider.vocab = head.vocab
        head = wider
    log.info("starting from %s (%s)", path, counted(head.arch.num_layers, "layer"))
    return head


def checkpoint_file(spec: str, store: AssetStore) -> Path:
    """The checkpoint of a target given by path or asset card (what its states' cache is
    keyed by)."""
    if is_path(spec):
        return user_path(spec)
    card = retrieve_card(store, "model.target", spec)
    return card.field("checkpoint").as_uri().to_path()
