"""Side-by-side latency benchmark: fairseq2 beam search vs speculative beam search.

Same target model, same sentences, same threads, in one run. Sentences are translated
one batch at a time with every method in turn (interleaved), so machine noise hits all
methods alike; each method's output is checked against the baseline's.

    python scripts/bench.py --target T.pt --draft D.pt --n 100 --beam 5 --gammas 2,4,6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from tqdm import tqdm

from specbeam.data import pad
from specbeam.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.inference import target_prompt
from specbeam.models import check_same_vocabulary, load_model
from specbeam.stats import SpecStats
from specbeam.task import TaskConfig


@dataclass
class Method:
    name: str
    generator: Seq2SeqGenerator
    seconds: list[float] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    mismatches: int = 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--n", type=int, default=100, help="sentences (from the start of the split)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--gammas", default="2,4,6")
    p.add_argument("--strategies", default="beam,linear")
    p.add_argument("--widths", default="", help="extra draft-beam widths (default: beam size only)")
    p.add_argument("--max-gen-len", default="1.5,10")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def build_methods(args: argparse.Namespace, target, draft, vocab_info) -> list[Method]:
    a, b = (float(x) for x in args.max_gen_len.split(","))
    common = dict(beam_size=args.beam, max_gen_len=(a, int(b)))
    methods = [Method("fairseq2 beam", BeamSearchSeq2SeqGenerator(target, vocab_info, **common))]
    widths = [None] + [int(w) for w in args.widths.split(",") if w]
    for strategy in args.strategies.split(","):
        for gamma in (int(g) for g in args.gammas.split(",")):
            for width in widths if strategy == "beam" else [None]:
                name = f"spec {strategy} γ={gamma}" + (f" w={width}" if width else "")
                gen = SpeculativeBeamSearchSeq2SeqGenerator(
                    target,
                    draft,
                    vocab_info,
                    gamma=gamma,
                    draft_strategy=strategy,
                    draft_width=width,
                    **common,
                )
                methods.append(Method(name, gen))
    return methods


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    task = TaskConfig()
    tokenizer = task.load_tokenizer()
    target = load_model(args.target)
    draft = load_model(args.draft, getattr(torch, args.draft_dtype))
    check_same_vocabulary(target, draft)
    encode = tokenizer.create_encoder(lang=task.src_lang, mode="source")
    pairs = task.split(args.split)[: args.n]
    prompt = target_prompt(tokenizer, task.tgt_lang)
    methods = build_methods(args, target, draft, tokenizer.vocab_info)
    batches = [pairs[i : i + args.batch] for i in range(0, len(pairs), args.batch)]
    for batch in tqdm(batches, desc="batches", file=sys.stderr):
        src, src_layout = pad([encode(p.source) for p in batch], 0)
        prompts, prompt_layout = pad([prompt] * len(batch), 0)
        reference = None
        for method in methods:
            started = time.perf_counter()
            out = method.generator(src, src_layout, prompts, prompt_layout)
            method.seconds.append(time.perf_counter() - started)
            tokens = [[h.seq.tolist() for h in hyps] for hyps in out.hypotheses]
            reference = tokens if reference is None else reference
            method.mismatches += sum(t != r for t, r in zip(tokens, reference, strict=True))
            if hasattr(out, "stats"):
                method.stats.merge(out.stats)
    report(methods, args)


def report(methods: list[Method], args: argparse.Namespace) -> None:
    base = sum(methods[0].seconds)
    print(f"\n{args.n} sentences of {args.split}, batch {args.batch}, beam {args.beam}, "
          f"{args.threads} threads, draft {args.draft_dtype}\n")  # fmt: skip
    print(
        "| method | total s | median ms/batch | speedup | τ | acceptance | target passes/sent | exact |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for m in methods:
        total = sum(m.seconds)
        speculative = m.stats.target_passes > 0
        row = {
            "method": m.name,
            "total_seconds": total,
            "median_ms": 1000 * statistics.median(m.seconds),
            "speedup": base / total,
            "tau": m.stats.tau if speculative else 1.0,
            "acceptance": m.stats.acceptance_rate if speculative else None,
            "passes_per_sentence": m.stats.source_passes / args.n if speculative else None,
            "mismatched_sentences": m.mismatches,
            "stats": m.stats.to_dict() if speculative else None,
        }
        rows.append(row)
        acc = f"{row['acceptance']:.2f}" if speculative else "–"
        passes = f"{row['passes_per_sentence']:.1f}" if speculative else "–"
        print(f"| {m.name} | {total:.1f} | {row['median_ms']:.0f} | {row['speedup']:.2f}× | "
              f"{row['tau']:.2f} | {acc} | {passes} | {args.n - m.mismatches}/{args.n} |")  # fmt: skip
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"args": settings, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
