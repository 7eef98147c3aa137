"""The embedded task's draft comparison: drafts and heads measured against one target.

    .venv/bin/python scripts/compare_drafts.py --target tasks/bible_es_en/models/target.pt \\
        --gamma 2 --draft-width 10 shipped=tasks/bible_es_en/models/head.pt new=~/.cache/specbeam/head/best.pt

For each draft checkpoint (a draft decoder or a draft head): its own parameters, one decoder
step's cost relative to the target's (beam 5, this CPU, the same call timed for both), top-1
and top-k agreement with the target under teacher forcing on dev, its own greedy dev BLEU
(drafts that translate alone), τ in exact speculative beam search, and the coverage of the
target's beam at each depth.

Coverage at depth d: the share of verification passes in which the target's beam took
step d inside the drafted tree (all k hypotheses it kept were drafted nodes), i.e. the
passes that advanced more than d steps. Every draft drafts trees of the same shape
(γ, width), so the counts compare at equal tree size. Writes drafts.md, drafts.json and
drafts.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import matplotlib
import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from sacrebleu.metrics import BLEU

from specbeam.apps.calibrate import measure_call_costs
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import load_decoding, make_generator
from specbeam.data.inference import translate_texts
from specbeam.data.task import TaskConfig
from specbeam.data.tokens import target_prompt_len, tokenize_pairs
from specbeam.integration.models import ModelPairConfig, cast_draft, load_model, num_parameters
from specbeam.search.head import DraftHead
from specbeam.training.agreement import measure_agreement

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def own_parameters(draft: torch.nn.Module, target: torch.nn.Module) -> int:
    """Parameters the draft adds: a shared encoder is the target's."""
    shared = {id(p) for p in target.parameters()}
    return sum(p.numel() for p in draft.parameters() if id(p) not in shared)


def greedy_bleu(draft: torch.nn.Module, tokenizer, task: TaskConfig, pairs: list) -> float:  # noqa: ANN001
    greedy = BeamSearchSeq2SeqGenerator(
        draft, tokenizer.vocab_info, beam_size=1, max_gen_len=(1.5, 10)
    )
    hyps = translate_texts(
        greedy, tokenizer, [p.source for p in pairs], task.src_lang, task.tgt_lang,
        max_tokens=4096,
    )  # fmt: skip
    return BLEU().corpus_score(hyps, [[p.target for p in pairs]]).score


def coverage_by_depth(histogram: dict[int, int], gamma: int) -> list[float]:
    """Depth d = 1..γ: the share of passes that advanced more than d beam steps."""
    passes = sum(histogram.values())
    return [sum(n for s, n in histogram.items() if s > d) / passes for d in range(1, gamma + 1)]


def draw(rows: list[dict], path: Path) -> None:
    fig, (cover_ax, agree_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for r in rows:
        depths = range(1, len(r["coverage_by_depth"]) + 1)
        cover_ax.plot(
            depths, r["coverage_by_depth"], "o-", label=f"{r['draft']} (τ {r['tau']:.2f})"
        )
    cover_ax.set(xlabel="depth", ylabel="coverage of the target's beam", ylim=(0, 1))
    cover_ax.set_xticks(list(depths))
    names = [r["draft"] for r in rows]
    x = range(len(rows))
    agree_ax.bar([i - 0.2 for i in x], [r["top1_agreement"] for r in rows], 0.4, label="top-1")
    k = next(key for key in rows[0] if key.startswith("top") and "_in_draft_" in key)
    agree_ax.bar([i + 0.2 for i in x], [r[k] for r in rows], 0.4, label=k.replace("_", " "))
    agree_ax.set_xticks(list(x), names)
    agree_ax.set(ylabel="agreement with the target (dev, teacher forcing)", ylim=(0, 1))
    for ax in (cover_ax, agree_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
    tokenizer = ModelPairConfig().load_tokenizer()
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
        params = own_parameters(
            draft, target
        )  # before the cast: a head's bf16 copies are not its own
        agree = measure_agreement(
            target, draft, tokenized, vocab.pad_idx or 0,
            prompt_len=target_prompt_len(tokenizer, task.tgt_lang),
        )  # fmt: skip
        some = dev[: args.bleu_sentences]
        bleu = None if isinstance(draft, DraftHead) else greedy_bleu(draft, tokenizer, task, some)
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
            "parameters": params,
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
            "coverage_by_depth": coverage_by_depth(run.stats.tau_histogram, decoding.gamma),
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
        f"| greedy dev BLEU ({args.bleu_sentences}) | τ | coverage at depth 1…{decoding.gamma} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bleu = "—" if r["greedy_dev_bleu"] is None else f"{r['greedy_dev_bleu']:.2f}"
        coverage = " / ".join(f"{c:.3f}" for c in r["coverage_by_depth"])
        lines.append(
            f"| {r['draft']} | {r['parameters'] / 1e6:.2f} M{' (+ target encoder)' if r['shares_encoder'] else ''} "
            f"| {r['draft_step_ms']:.2f} ({r['target_step_ms']:.2f}) | {r['step_cost_ratio']:.2f} "
            f"| {r['top1_agreement']:.3f} | {r[k]:.3f} | {bleu} | {r['tau']:.2f} | {coverage} |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "drafts.md").write_text("\n".join(lines) + "\n")
    (out / "drafts.json").write_text(json.dumps(rows, indent=1) + "\n")
    draw(rows, out / "drafts.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
