"""Sequence-level distillation data: the target's beam-search translations of the
training sources, written chunk by chunk (resumable, shardable), then merged.

    python -m specbeam.distill model.target=~/.cache/specbeam/target/best.pt \
        model.tokenizer=bible_es_en_target shard=0/2
    python -m specbeam.distill ... shard=1/2          # another process or machine
    python -m specbeam.distill ... merge_only=true     # -> out_dir/train.tsv

With a draft in `model` and a speculative `decoding`, the output is the same and faster.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from tqdm import tqdm

from specbeam import startup
from specbeam.apps.app import (
    PipelineConfig,
    before_hydra,
    parse_shard,
    run_app,
)
from specbeam.data.inference import translate_texts
from specbeam.data.pairs import Pair
from specbeam.paths import SHIPPED
from specbeam.plural import counted

log = logging.getLogger("specbeam.distill")


@dataclass(kw_only=True)
class DistillConfig(PipelineConfig):
    split: str = "train"
    """The task's split whose sources the target translates."""
    limit: int = 0
    """Distill the first n pairs of the split (a trial of the chain); 0 = all. Chunks of
    another limit are another distillation (`out_dir/chunks/origin.json`)."""
    out_dir: str = "~/.cache/specbeam/distill"
    """Where the chunks (`chunks/`) and then the merged `<split>.tsv` are written; a rerun
    with the same settings resumes there."""
    chunk_size: int = 256
    """Pairs per chunk: the unit of writing, resuming and sharding; ≥ 1."""
    shard: str = "0/1"
    """i/n: this process translates chunks c with c % n == i."""
    merge_only: bool = False
    """true: translate nothing, only join the chunks every shard wrote into
    `<out_dir>/<split>.tsv`; false: translate this shard's missing chunks first, then merge
    if none is missing."""


ConfigStore.instance().store(name="distill_schema", node=DistillConfig)


def chunk_path(out: Path, chunk: int) -> Path:
    return out / "chunks" / f"{chunk:05d}.tsv"


def distill(cfg: DistillConfig) -> None:
    out = Path(cfg.out_dir).expanduser()
    if cfg.chunk_size < 1:
        raise ValueError(f"chunk_size={cfg.chunk_size} is invalid: must be ≥ 1")
    if cfg.limit < 0:
        raise ValueError(f"limit={cfg.limit} is invalid: must be ≥ 0 (0: all)")
    parse_shard(cfg.shard)  # before anything is written
    pairs = cfg.task.split(cfg.split)[: cfg.limit or None]
    if not pairs:
        raise ValueError(f"split '{cfg.split}' in task.data_dir={cfg.task.data_dir} holds no pairs")
    chunks = [pairs[i : i + cfg.chunk_size] for i in range(0, len(pairs), cfg.chunk_size)]
    check_origin(cfg, out, pairs)
    if not cfg.merge_only:
        translate_chunks(cfg, out, chunks)
    missing = [c for c in range(len(chunks)) if not chunk_path(out, c).exists()]
    if missing and cfg.merge_only:
        raise ValueError(
            f"merge_only=true: {len(missing)} of {counted(len(chunks), 'chunk')} are missing "
            f"from {out / 'chunks'}; make them first with the same settings and no merge_only "
            "(`python -m specbeam.distill … shard=i/n` for each shard)"
        )
    if missing:
        log.info(
            "%s of %d still missing: merge_only=true once every shard is done",
            counted(len(missing), "chunk"), len(chunks),
        )  # fmt: skip
        return
    merged = out / f"{cfg.split}.tsv"
    tmp = merged.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for c in range(len(chunks)):
            f.write(chunk_path(out, c).read_text(encoding="utf-8"))
    os.replace(tmp, merged)
    log.info("wrote %s (%s)", merged, counted(len(pairs), "pair"))


def origin(cfg: DistillConfig, pairs: list[Pair]) -> dict[str, object]:
    """What a chunk's lines depend on: the target and the precision it runs in (auto
    resolved), the decoding as this machine's calibration tunes it, the task's side, the
    split's content (a file edited between shards moves every later chunk's pairs; its
    directory is another path on each install) and the chunking."""
    task = cfg.task
    text = "".join(f"{p.ref}\t{p.source}\n" for p in pairs)
    cfg.settle()  # the decoding as run
    found = {
        "target": cfg.model.target, "tokenizer": cfg.model.tokenizer_card(),
        "target_dtype": cfg.hardware.target_precision,
        **{f"decoding.{k}": v for k, v in dataclasses.asdict(cfg.decoding).items()},
        "split": cfg.split,
        "sources": f"{len(pairs)} pairs, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}",
        "src_lang": task.src_lang, "tgt_lang": task.tgt_lang, "chunk_size": cfg.chunk_size,
    }  # fmt: skip
    return json.loads(json.dumps(found))  # as read back: tuples are lists


def check_origin(cfg: DistillConfig, out: Path, pairs: list[Pair]) -> None:
    """Chunks are resumed by file name, so an `out_dir` already holding chunks of another
    target, decoding or data (the default one, used before for another model; a shard
    run after the split changed) would be merged into this one's unnoticed: refuse it,
    and record this run's origin."""
    path = out / "chunks" / "origin.json"
    wanted = origin(cfg, pairs)
    if path.exists():
        found = json.loads(path.read_text(encoding="utf-8"))
        if found != wanted:
            differ = ", ".join(f"{k} {found.get(k)} (not {v})" for k, v in wanted.items()
                               if found.get(k) != v)  # fmt: skip
            raise ValueError(
                f"out_dir={cfg.out_dir} holds chunks of another distillation: {differ}; "
                "give another out_dir, or remove that one"
            )
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=1) + "\n", encoding="utf-8")


def translate_chunks(cfg: DistillConfig, out: Path, chunks: list) -> None:
    shard, num_shards = parse_shard(cfg.shard)
    todo = [c for c in range(shard, len(chunks), num_shards) if not chunk_path(out, c).exists()]
    if not todo:
        return
    tokenizer, generator = cfg.build()
    (out / "chunks").mkdir(parents=True, exist_ok=True)
    bar = tqdm(todo, desc=f"distill shard {cfg.shard}", unit="chunk")
    done = 0
    try:
        for c in bar:
            chunk = chunks[c]
            hyps = translate_texts(
                generator, tokenizer, [p.source for p in chunk], cfg.task.src_lang,
                cfg.task.tgt_lang, max_tokens=cfg.hardware.batch_tokens,
            )  # fmt: skip
            path = chunk_path(out, c)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(
                "".join(f"{p.ref}\t{p.source}\t{h}\n" for p, h in zip(chunk, hyps, strict=True)),
                encoding="utf-8",
            )
            os.replace(tmp, path)  # a chunk file is complete or absent
            done += 1
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (`startup.Terminated`)
        bar.close()  # before the message: the bar's last line would follow it
        print(
            f"{startup.stopped(stop)}: {done} of this run's {counted(len(todo), 'chunk')} "
            f"(shard {cfg.shard}) are in {out / 'chunks'}; run the same command again to continue",
            file=sys.stderr,
        )
        raise SystemExit(startup.exit_code(stop)) from None


@hydra.main(version_base=None, config_path=str(SHIPPED / "conf"), config_name="distill")
def main(cfg: DistillConfig) -> None:
    run_app(distill, cfg)


def cli() -> None:
    """The command line (`app.before_hydra`)."""
    before_hydra(sys.argv[1:], "distill", __doc__)
    main()
