"""A draft's agreement with the target along each rank of the target's own n-best lists.

Exact beam search continues a pass only when all k hypotheses the target keeps were drafted,
so a draft trained on the target's best translations must also rank well along the others.
This decodes dev sources with the target's beam search (specbeam's lean plain search, the
same output as fairseq2's) and measures teacher-forced agreement
(`specbeam.training.agreement`) on the references and on the hypotheses of each rank:

    .venv/bin/python scripts/nbest_agreement.py --sentences 150

Prints a Markdown table; writes nbest_agreement.md and .json to --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from specbeam.apps.data import TokenizedPair, pad, target_prompt_len, tokenize_pairs
from specbeam.apps.decoding import load_decoding, make_generator
from specbeam.apps.inference import target_prompt
from specbeam.apps.task import TaskConfig
from specbeam.integration.models import ModelPairConfig, load_model
from specbeam.training.agreement import measure_agreement

REPO_ROOT = Path(__file__).resolve().parents[1]  # scripts run from a checkout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=str(REPO_ROOT / "tasks/bible_es_en/models/target.pt"))
    ap.add_argument("--draft", default=str(REPO_ROOT / "tasks/bible_es_en/models/head.pt"))
    ap.add_argument("--sentences", type=int, default=150, help="the first n dev sentences")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench_out/nbest_agreement")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    task = TaskConfig()
    tokenizer = ModelPairConfig().load_tokenizer()
    target = load_model(Path(args.target).expanduser())
    draft = load_model(Path(args.draft).expanduser(), target=target)
    pairs = tokenize_pairs(
        task.split("dev")[: args.sentences], tokenizer, task.src_lang, task.tgt_lang
    )
    decoding = load_decoding("beam_lean")
    beam = make_generator(decoding, target, None, tokenizer.vocab_info)
    prompt = target_prompt(tokenizer, task.tgt_lang)
    k = decoding.beam_size
    ranks: list[list[TokenizedPair]] = [[] for _ in range(k)]
    with torch.inference_mode():
        for pair in tqdm(pairs, desc="n-best lists", unit="sentence"):
            hyps = beam(*pad([pair.source], 0), *pad([prompt], 0)).hypotheses[0]
            for rank, hyp in enumerate(hyps[:k]):  # a hypothesis' seq leaves out the prompt
                ranks[rank].append(TokenizedPair(pair.source, torch.cat([prompt, hyp.seq])))
    prompt_len = target_prompt_len(tokenizer, task.tgt_lang)
    rows = []
    for name, along in [("references", pairs)] + [(f"beam rank {r + 1}", ps) for r, ps in enumerate(ranks)]:  # fmt: skip
        a = measure_agreement(
            target, draft, along, tokenizer.vocab_info.pad_idx or 0, prompt_len=prompt_len
        )
        key = f"top{a.k}_in_draft_top{a.width}"  # as compare_drafts.py names it
        rows.append({"along": name, "positions": a.positions, "top1": a.top1, key: a.topk_covered})
    lines = [
        f"| teacher-forced along | positions | top-1 agreement | {key.replace('_', ' ')} |",
        "|---|---|---|---|",
        *(f"| {r['along']} | {r['positions']:,} | {r['top1']:.3f} | {r[key]:.3f} |" for r in rows),
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nbest_agreement.md").write_text("\n".join(lines) + "\n")
    (out / "nbest_agreement.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
