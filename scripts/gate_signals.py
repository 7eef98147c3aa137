"""Which signal, known before a pass's target call, predicts the steps the pass advances?

    .venv/bin/python scripts/gate_signals.py --sentences 200 --depth 4

Runs exact spec_beam on dev sentences of the embedded pair at batch 1, always speculating
at a fixed depth (so that a pass at any shallower depth d would have advanced
min(steps, d + 1): the draft's beam search draws its first levels the same at any depth),
and records per pass: its steps, the previous pass's steps and the target's top-1
probability at the step just taken (free), and the draft's first-level signals (after its
first call): top-1 probabilities of the live hypotheses, the margin between the k-th and
(w + 1)-th best extension, the gap between the k-th and (k + 1)-th, and the probability mass
of the w best extensions (`draft.first_level_mass`, what `planner.Gate` uses). Prints, per
signal, Spearman's ρ with the steps and the mean steps per sextile, with the speedup the
hardware config's cost model predicts for a pass of each depth there (no gating overhead).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Models, load_config  # noqa: E402

from specbeam.apps.compare import MethodRun, run_side_by_side  # noqa: E402
from specbeam.apps.decoding import load_decoding  # noqa: E402
from specbeam.search import draft as draft_module  # noqa: E402
from specbeam.search import generator as generator_module  # noqa: E402
from specbeam.search.planner import PassShape, PlanCosts  # noqa: E402

FREE = ("prev_steps", "target_top1")  # known when the previous pass ends


def record(sentences: int, depth: int, hardware: str) -> tuple[list[dict], PlanCosts, object]:
    """Per (pass, source) signals and steps; the machine's costs; the tree's shape."""
    cfg = load_config("bible_es_en", hardware)
    models = Models.load(cfg)
    d = cfg.hardware.tune(load_decoding("spec_beam"))
    d = dataclasses.replace(d, plan=False, gamma=depth, gamma_bounds=None)
    rows: list[dict] = []
    first: dict = {}
    last: dict = {}
    children, accept = draft_module.children, generator_module._Op._accept

    def recording_children(shape, cand, width, level):
        if level == 0:
            lp = cand - cand.logsumexp(-1, keepdim=True)
            top1 = lp.max(-1).values.exp()
            top = cand.flatten(1).topk(width + 1).values
            k = shape.beam_size
            first.update(
                draft_top1_best=top1[:, 0].tolist(),
                draft_top1_min=top1.min(-1).values.tolist(),
                draft_top1_mean=top1.mean(-1).tolist(),
                draft_margin=(top[:, k - 1] - top[:, width]).tolist(),
                draft_gap_k=(top[:, k - 1] - top[:, k]).tolist(),
                draft_mass=cand.flatten(1).log_softmax(-1).topk(width).values.exp().sum(-1).tolist(),
            )  # fmt: skip
        return children(shape, cand, width, level)

    def recording_accept(op, verification, tree):
        sources = op.state.source_ids.tolist()
        acc = accept(op, verification, tree)
        logits = verification.logits_at(verification.slot_of(acc.origin, acc.node))
        top1 = logits.float().log_softmax(-1).max(-1).values.exp()[:, 0]
        for i, source in enumerate(sources):
            key = (id(op), source)
            prev_steps, target_top1 = last.get(key, (-1, -1.0))
            rows.append({**{n: v[i] for n, v in first.items()}, "steps": int(acc.steps[i]),
                         "prev_steps": prev_steps, "target_top1": target_top1})  # fmt: skip
            last[key] = (int(acc.steps[i]), float(top1[i]))
        first.clear()
        return acc

    draft_module.children = recording_children
    generator_module._Op._accept = recording_accept
    try:
        run = MethodRun("spec_beam", models.generator(d))
        dev = [p.source for p in cfg.task.split("dev")[:sentences]]
        run_side_by_side([run], models.tokenizer, dev, cfg.task.src_lang, cfg.task.tgt_lang,
                         batch_size=1, desc="dev")  # fmt: skip
    finally:
        draft_module.children, generator_module._Op._accept = children, accept
    return rows, PlanCosts.from_stored(cfg.hardware.costs), d.draft_shape()


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


def report(rows: list[dict], costs: PlanCosts, shape) -> None:
    steps = np.array([r["steps"] for r in rows])
    k, depth = shape.beam_size, shape.depth
    plain = costs.plain_ms(k)
    spec = [costs.pass_ms(True, k, 1, PassShape.expected(shape.at_depth(d), 1.0)) for d in range(1, depth + 1)]  # fmt: skip
    print(
        f"{len(rows)} passes, mean steps {steps.mean():.2f}, histogram {np.bincount(steps).tolist()}"
    )
    print(
        f"plain step {plain:.2f} ms; pass at depth 1..{depth}: {', '.join(f'{m:.2f}' for m in spec)} ms"
    )
    for name in [n for n in rows[0] if n != "steps"]:
        x = np.array([r[name] for r in rows], dtype=float)
        ok = x >= 0 if name in FREE else np.isfinite(x)
        xs, st = x[ok], steps[ok]
        print(f"\n{name}: n={ok.sum()}, Spearman ρ with steps {rank_correlation(xs, st):.3f}")
        edges = np.unique(np.quantile(xs, np.linspace(0, 1, 7)))
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            m = (xs >= lo) & ((xs <= hi) if hi == edges[-1] else (xs < hi))
            taus = [np.minimum(st[m], d + 1).mean() for d in range(1, depth + 1)]
            gains = [t * plain / c for t, c in zip(taus, spec, strict=True)]
            print(f"  [{lo:7.3f}, {hi:7.3f}] n={m.sum():4d}  steps at depth 1..{depth}: "
                  + " ".join(f"{t:.2f}" for t in taus) + "  predicted speedup: "
                  + " ".join(f"{g:.2f}" for g in gains))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=200, help="dev sentences")
    parser.add_argument("--depth", type=int, default=4, help="the fixed tree depth")
    parser.add_argument("--hardware", default="cpu", help="conf/hardware/<name>.yaml")
    args = parser.parse_args()
    report(*record(args.sentences, args.depth, args.hardware))


if __name__ == "__main__":
    main()
