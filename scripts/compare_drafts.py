"""The embedded task's draft comparison: for each draft checkpoint, its own parameters, one
decoder step's cost relative to the target's (beam 5, this CPU, the same call timed for
both), top-1 and top-k agreement with the target under teacher forcing on dev, its own
greedy dev BLEU, and τ in exact speculative beam search.

    .venv/bin/python scripts/compare_drafts.py --target ~/.cache/specbeam/target_final.pt \\
        ref=~/.cache/specbeam/draft_ref/best.pt small_kd=~/.cache/specbeam/draft_small_kd/best.pt

Writes drafts.md and drafts.json to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from sacrebleu.metrics import BLEU

from specbeam.apps.calibrate import measure_call_costs
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.data import tokenize_pairs
from specbeam.apps.decoding import load_decoding, make_generator
from specbeam.apps.inference import translate_texts
from specbeam.apps.task import TaskConfig
from specbeam.integration.models import cast_draft, load_model, num_parameters
from specbeam.training.agreement import measure_agreement


def own_parameters(draft: torch.nn.Module, target: torch.nn.Module) -> int:
    """Parameters the draft adds: a shared encoder is the target's."""
    shared = {id(p) for p in target.parameters()}
    return sum(p.numel() for p in draft.parameters() if id(p) not in shared)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drafts", nargs="+", help="NAME=CHECKPOINT")
    ap.add_argument("--target", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--agreement-sentences", type=int, default=0, help="dev sentences; 0 = all")
    ap.add_argument("--bleu-sentences", type=int, default=300)
    ap.add_argument("--tau-sentences", type=int, default=20)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--draft-width", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="bench_out/drafts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    task = TaskConfig()
    tokenizer = task.load_tokenizer()
    vocab = tokenizer.vocab_info
    dev = task.split("dev")
    target = load_model(Path(args.target).expanduser())
    tokenized = tokenize_pairs(
        dev[: args.agreement_sentences or None], tokenizer, task.src_lang, task.tgt_lang
    )
    source = tokenized[len(tokenized) // 2].source
    decoding = dataclasses.replace(
        load_decoding("spec_beam"), gamma=args.gamma, draft_width=args.draft_width
    )
    rows = []
    for spec in args.drafts:
        name, path = spec.split("=", 1)
        draft = load_model(Path(path).expanduser(), target=target)
        agree = measure_agreement(target, draft, tokenized, vocab.pad_idx or 0)
        greedy = BeamSearchSeq2SeqGenerator(draft, vocab, beam_size=1, max_gen_len=(1.5, 10))
        some = dev[: args.bleu_sentences]
        hyps = translate_texts(
            greedy, tokenizer, [p.source for p in some], task.src_lang, task.tgt_lang,
            max_tokens=4096,
        )  # fmt: skip
        bleu = BLEU().corpus_score(hyps, [[p.target for p in some]]).score
        fast = cast_draft(draft, target, torch.bfloat16)
        with torch.inference_mode():
            ms = measure_call_costs(
                target, fast, source, hyps=decoding.beam_size, prefix_len=20,
                slot_counts=[decoding.beam_size], repeats=args.repeats,
                lean_draft=decoding.lean_draft,
            )  # fmt: skip
            run = MethodRun("spec", make_generator(decoding, target, fast, vocab))
            run_side_by_side(
                [run], tokenizer, [p.source for p in dev[: args.tau_sentences]],
                task.src_lang, task.tgt_lang, batch_size=1, desc=f"τ {name}",
            )  # fmt: skip
        step = {m: t[decoding.beam_size] for m, t in ms.items()}
        rows.append({
            "draft": name,
            "checkpoint": path,
            "parameters": own_parameters(draft, target),
            "shares_encoder": draft.encoder is target.encoder,
            "draft_step_ms": step["draft"],
            "target_step_ms": step["target"],
            "step_cost_ratio": step["draft"] / step["target"],
            "top1_agreement": agree.top1,
            f"top{agree.k}_in_draft_top{agree.width}": agree.topk_covered,
            "agreement_positions": agree.positions,
            "greedy_dev_bleu": bleu,
            "bleu_sentences": len(some),
            "tau": run.stats.tau,
            "tau_sentences": args.tau_sentences,
            "gamma": decoding.gamma,
            "draft_width": decoding.draft_width,
        })  # fmt: skip
        print(json.dumps(rows[-1]), file=sys.stderr)
    k = f"top{agree.k}_in_draft_top{agree.width}"
    lines = [
        f"Target {args.target}: {num_parameters(target):,} parameters. Step = one decoder call "
        f"over {decoding.beam_size} hypotheses (beam {decoding.beam_size}, 20 cached positions, "
        f"draft bf16, target fp32, {args.threads} threads, median of {args.repeats}). Agreement: "
        f"teacher forcing on {agree.positions} dev reference positions. τ: exact spec_beam, "
        f"γ {decoding.gamma}, width {decoding.draft_width}, {args.tau_sentences} dev sentences, "
        "batch 1.",
        "",
        f"| draft | own params | step ms (target ms) | cost ratio | top-1 agree | {k.replace('_', ' ')} "
        f"| greedy dev BLEU ({args.bleu_sentences}) | τ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['draft']} | {r['parameters'] / 1e6:.2f} M{' (+ target encoder)' if r['shares_encoder'] else ''} "
            f"| {r['draft_step_ms']:.2f} ({r['target_step_ms']:.2f}) | {r['step_cost_ratio']:.2f} "
            f"| {r['top1_agreement']:.3f} | {r[k]:.3f} | {r['greedy_dev_bleu']:.2f} | {r['tau']:.2f} |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "drafts.md").write_text("\n".join(lines) + "\n")
    (out / "drafts.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
