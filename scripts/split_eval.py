"""Issue 17: does splitting long lines cost BLEU? Joins 5-10 consecutive dev verses of one
chapter into paragraphs (seeded), then translates them three ways with the translate app's
own `translate_chunk`: split (`split_above_tokens`, as translate does), the verses one by
one (outputs joined with a space) and each paragraph whole (splitting off), and scores each
against the joined reference verses with sacrebleu.

    .venv/bin/python scripts/split_eval.py --decoding beam --out /tmp/split_beam.json
    .venv/bin/python scripts/split_eval.py --decoding beam --first 20 --systems split \\
        --out /tmp/beam20.json
    .venv/bin/python scripts/split_eval.py --decoding spec_beam --first 20 \\
        --systems split --same-as /tmp/beam20.json

The first ran in about 11 minutes on this 2-core machine with other jobs running (one
thread; split 203 s, verses 220 s, whole 211 s). `--same-as` checks that another decoding's
translations equal a saved run's, paragraph for paragraph; compare runs over the same
paragraphs (`--first`), since a batch's length limit depends on the lines batched with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from itertools import groupby
from pathlib import Path

from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU

from specbeam.apps.decoding import load_decoding
from specbeam.apps.hardware import HardwareConfig
from specbeam.apps.split import Splitter
from specbeam.apps.translate import TranslateConfig, translate_chunk

REPO_ROOT = Path(__file__).resolve().parents[1]  # scripts run from a checkout

SYSTEMS = ("split", "verses", "whole")


def paragraphs(pairs: list, count: int, seed: int) -> list[list]:
    """`count` runs of 5-10 consecutive verses of one chapter, in corpus order."""
    rng = random.Random(seed)
    runs = []
    for _, chapter in groupby(pairs, key=lambda p: p.ref.rsplit(":", 1)[0]):
        verses = list(chapter)
        i = 0
        while i < len(verses):
            n = rng.randint(5, 10)
            if len(verses[i : i + n]) >= 5:
                runs.append(verses[i : i + n])
            i += n
    return [runs[i] for i in sorted(rng.sample(range(len(runs)), count))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoding", default="beam")
    parser.add_argument("--paragraphs", type=int, default=100)
    parser.add_argument("--first", type=int, help="translate only the first N of them")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="1 is faster on a busy machine")
    parser.add_argument("--split-above-tokens", type=int, default=100)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--out", type=Path, help="save translations and scores (JSON)")
    parser.add_argument("--same-as", type=Path, help="a saved run whose outputs must match")
    args = parser.parse_args()

    hardware = OmegaConf.merge(
        OmegaConf.structured(HardwareConfig), OmegaConf.load(REPO_ROOT / "conf/hardware/cpu.yaml")
    )
    hardware.threads = args.threads
    cfg = TranslateConfig(
        decoding=load_decoding(args.decoding),
        hardware=OmegaConf.to_object(hardware),
        chunk_lines=1_000_000,
        split_above_tokens=args.split_above_tokens,
    )
    tokenizer, generator = cfg.build()
    off = dataclasses.replace(cfg, split_above_tokens=0)
    runs = paragraphs(cfg.task.split("dev"), args.paragraphs, args.seed)[: args.first]
    sources = [" ".join(p.source for p in run) for run in runs]
    refs = [" ".join(p.target for p in run) for run in runs]
    verses = [p.source for run in runs for p in run]

    def translate(config: TranslateConfig, lines: list[str]) -> tuple[list[str], list[dict]]:
        splitter = Splitter(tokenizer, config.task.src_lang, config.split_above_tokens)
        return translate_chunk(config, tokenizer, generator, splitter, lines, 0, 0)

    bleu = BLEU()
    report: dict = {"decoding": args.decoding, "paragraphs": len(runs), "verses": len(verses)}
    for system in args.systems:
        started = time.perf_counter()
        if system == "verses":
            outs, _ = translate(off, verses)
            it = iter(outs)
            hyps = [" ".join(next(it) for _ in run) for run in runs]
            pieces = len(verses)
        else:
            hyps, records = translate(cfg if system == "split" else off, sources)
            pieces = sum(r.get("pieces", 1) for r in records)
            if system == "split":
                report["split_paragraphs"] = sum("pieces" in r for r in records)
                report["cut_without_boundary"] = sum(
                    r.get("cut_without_boundary", 0) for r in records
                )
        seconds = time.perf_counter() - started
        score = bleu.corpus_score(hyps, [refs])
        report[system] = {"bleu": round(score.score, 2), "seconds": round(seconds, 1),
                          "sources": pieces, "hyps": hyps}  # fmt: skip
        print(
            f"{system:6}  BLEU {score.score:5.2f}  {seconds:6.1f} s  {pieces} sources", flush=True
        )
    report["signature"] = str(bleu.get_signature())
    print(report["signature"])
    if args.same_as:
        saved = json.loads(args.same_as.read_text())
        for system in args.systems:
            ours = report[system]["hyps"]
            same = sum(a == b for a, b in zip(ours, saved[system]["hyps"], strict=False))
            print(f"{system}: {same}/{len(ours)} paragraphs identical to {args.same_as}")
    if args.out:
        args.out.write_text(json.dumps(report, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
