"""What speculation would gain an NLLB dense_600m target on this CPU: the cost model's
prediction, not a measurement of translation speed.

    .venv/bin/python scripts/predict_600m.py --tau spec_beam=2.16 --tau spec_greedy=2.33 \\
        --tau relaxed=3.36 [--tau relaxed=2.8 ...] [--cards DIR] [--repeats 7] [--runs 3]

Writes fairseq2's registered `dense_600m` NLLB architecture with random weights, the
embedded task's vocabulary (8000 pieces: NLLB's own is not available offline) and a randomly
initialised draft head behind cards (`random_nllb_cards`, in a child process, into a
temporary directory unless --cards), and loads the pair by card through specbeam's hub as
`model.target=<card>` does. Then, on one example verse and with the machine's settings of
conf/hardware/cpu.yaml:
- times target and head calls over T query tokens at several prefix lengths (the calibrate
  app's `measure_call_costs`) and fits a + b·T ms (`LinearCost.fit`);
- times plain and speculative searches (planner off), interleaved, for the work beside the
  calls: `plain_step_ms` and `accept_ms`, as `PlanCosts.fit` takes them. The random head's
  τ means nothing; its passes cost what a trained head's do;
- prices each search as the planner does (`PlanCosts.speedup`) at the τ given by --tau
  (a trained head's, measured elsewhere) and the tree of cpu.yaml's `tuned` settings, both
  with the work beside the calls measured here and with cpu.yaml's (the embedded pair's),
  and a perfect draft's trees (`PassShape.perfect`);
- reports the peak resident memory of this process (loading, timing, searching).
Prints Markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import tempfile
from pathlib import Path

import torch

from specbeam.apps.calibrate import CountingGenerator, measure_call_costs, peak_rss_mb
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator
from specbeam.apps.hardware import HardwareConfig, load_hardware
from specbeam.integration.cards import random_nllb_cards
from specbeam.integration.models import ModelPairConfig, num_parameters, open_pair
from specbeam.kernels.cpu import cpu_kind
from specbeam.kernels.runtime import Runtime
from specbeam.paths import SHIPPED
from specbeam.search.draft import DraftShape
from specbeam.search.head import HeadArch
from specbeam.search.planner import LinearCost, PassShape, PlanCosts, beside_calls_ms

NAME = "dense_600m_random"
TOKENIZER_CARD = "bible_es_en_target"
SEARCHES = ("spec_beam", "spec_greedy", "relaxed")
PERFECT = ((2, 10), (4, 5))
"""(γ, width) of exact spec_beam's trees priced with a perfect draft."""
LANGS = ("spa_Latn", "eng_Latn")


def write_cards(card_dir: Path) -> None:
    random_nllb_cards(card_dir, NAME, "dense_600m", TOKENIZER_CARD, HeadArch())


def example_verse() -> str:
    """The embedded examples' verse of median length."""
    lines = (SHIPPED / "tasks/bible_es_en/examples.es").read_text().splitlines()
    return sorted(lines, key=len)[len(lines) // 2]


def decoding(hw: HardwareConfig, name: str, gen_len: int, **changes: object) -> DecodingConfig:
    """A decoding as this machine tunes it, `gen_len` tokens at most, the planner off."""
    config = hw.tune(load_decoding(name))
    return dataclasses.replace(config, max_gen_len=(0.0, gen_len), plan=False, **changes)


def parse_taus(items: list[str]) -> dict[str, list[float]]:
    """SEARCH=TAU items: each search's τ (a row each where one is given twice)."""
    taus: dict[str, list[float]] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in SEARCHES:
            raise SystemExit(f"--tau {item}: the search is one of {', '.join(SEARCHES)}")
        taus.setdefault(name, []).append(float(value))
    missing = set(SEARCHES) - set(taus)
    if missing:
        raise SystemExit(f"--tau is missing for {', '.join(sorted(missing))}")
    return taus


def fmt(cost: LinearCost) -> str:
    return f"{cost.a:.2f} + {cost.b:.3f}·T"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tau", action="append", default=[], metavar="SEARCH=TAU", required=True)
    parser.add_argument("--cards", type=Path, help="card directory (kept; written if absent)")
    parser.add_argument("--prefix-lens", type=int, nargs="+", default=[5, 20, 40])
    parser.add_argument("--slot-counts", type=int, nargs="+", default=[1, 5, 10, 25, 50])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds of calls")
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs of each search")
    parser.add_argument("--gen-len", type=int, default=30, help="tokens per run")
    args = parser.parse_args()
    taus = parse_taus(args.tau)
    with tempfile.TemporaryDirectory() as tmp:
        card_dir = args.cards or Path(tmp) / "cards"
        if not card_dir.exists():  # a child, so that this process's peak is a user's
            writer = multiprocessing.get_context("spawn").Process(
                target=write_cards, args=(card_dir,)
            )
            writer.start()
            writer.join()
            if writer.exitcode:
                raise SystemExit(f"writing the cards failed (exit code {writer.exitcode})")
        report(args, taus, card_dir)


def report(args: argparse.Namespace, taus: dict[str, list[float]], card_dir: Path) -> None:
    hw = load_hardware("cpu")
    hw.apply()
    model = ModelPairConfig(target=NAME, draft=f"{NAME}_head", asset_dirs=[str(card_dir)])
    pair = hw.place(open_pair(model, *LANGS, with_draft=True, draft_dtype=hw.draft_torch_dtype))
    target, draft, tokenizer = pair.target, pair.draft, pair.tokenizer
    assert draft is not None
    verse = example_verse()
    source = tokenizer.create_encoder(lang=LANGS[0], mode="source")(verse)
    vocab = tokenizer.vocab_info
    k = load_decoding("spec_beam").beam_size
    with torch.inference_mode(), Runtime(hw.runtime_config()).active():
        fits = {}
        for prefix in args.prefix_lens:
            points = measure_call_costs(
                target, draft, source, hyps=k, prefix_len=prefix, slot_counts=args.slot_counts,
                repeats=args.repeats,
            )  # fmt: skip
            fits[prefix] = {m: (LinearCost.fit(p), p) for m, p in points.items()}
    unplanned = dataclasses.replace(hw, costs={})
    configs = {name: decoding(hw, name, args.gen_len) for name in SEARCHES}
    generators = {
        "beam": make_generator(decoding(hw, "beam", args.gen_len), target, None, vocab, hw),
        "beam_lean": make_generator(decoding(hw, "beam_lean", args.gen_len), target, None, vocab, hw),
        "greedy": make_generator(decoding(hw, "greedy", args.gen_len), target, None, vocab, hw),
        "greedy_lean": make_generator(
            decoding(hw, "beam_lean", args.gen_len, beam_size=1), target, None, vocab, hw
        ),
        **{n: make_generator(c, target, draft, vocab, unplanned) for n, c in configs.items()},
    }  # fmt: skip

    def side_by_side(runs: int) -> dict[str, MethodRun]:
        """Every search on the verse `runs` times, interleaved; plain fairseq2's count steps."""
        methods = {
            n: MethodRun(n, CountingGenerator(g) if n in ("beam", "greedy") else g)
            for n, g in generators.items()
        }
        with torch.inference_mode():
            run_side_by_side(
                list(methods.values()), tokenizer, [verse] * runs, *LANGS, batch_size=1,
                desc="searches",
            )  # fmt: skip
        return methods

    side_by_side(1)  # warm-up: first calls pack weights and allocate
    timed = side_by_side(args.runs)
    plain = {n: timed[n] for n in ("beam", "beam_lean", "greedy", "greedy_lean")}
    spec = {n: timed[n] for n in SEARCHES}
    peak_mb = peak_rss_mb()
    mid = args.prefix_lens[len(args.prefix_lens) // 2]
    target_cost, draft_cost = fits[mid]["target"][0], fits[mid]["draft"][0]

    def step_ms(run: MethodRun, counted: MethodRun) -> float:
        """ms per step of `run`; `counted` (fairseq2's, same output) counts the steps."""
        assert isinstance(counted.generator, CountingGenerator)
        return 1000 * run.total_seconds / max(counted.generator.calls, 1)

    steps = {
        5: (step_ms(plain["beam_lean"], plain["beam"]), step_ms(plain["beam"], plain["beam"])),
        1: (step_ms(plain["greedy_lean"], plain["greedy"]), step_ms(plain["greedy"], plain["greedy"])),
    }  # fmt: skip
    stored = PlanCosts.from_stored(hw.costs)
    print(f"CPU: {cpu_kind()}, {hw.threads} threads, head in {hw.draft_torch_dtype}")
    print(
        f"target: fairseq2 `dense_600m` (random weights), vocabulary {vocab.size}, "
        f"{num_parameters(target) / 1e6:.0f} M parameters; head {HeadArch()}, "
        f"{sum(p.numel() for p in draft.own_parameters()) / 1e6:.0f} M own parameters"
    )
    print(f"verse ({len(source)} tokens): {verse}\n")
    print(
        f"Calls over T query tokens of one source, {k} hypotheses (median ms of {args.repeats}):\n"
    )
    print(
        "| prefix | target a + b·T | head a + b·T | target ms at T = "
        + ", ".join(map(str, args.slot_counts))
        + " | head ms |"
    )
    print("|---|---|---|---|---|")
    for prefix, fit in fits.items():
        (t, tp), (d, dp) = fit["target"], fit["draft"]
        print(
            f"| {prefix} | {fmt(t)} | {fmt(d)} | {', '.join(f'{v:.1f}' for v in tp.values())} "
            f"| {', '.join(f'{v:.1f}' for v in dp.values())} |"
        )
    print(f"\nPlain steps (ms, {args.runs} runs of {args.gen_len} tokens): " + "; ".join(
        f"beam {b}: specbeam's {lean:.2f}, fairseq2's {f2:.2f}" for b, (lean, f2) in steps.items()
    ))  # fmt: skip
    print(f"peak RSS of this process: {peak_mb:.0f} MiB\n")
    print(f"Predicted speedup (calls fitted at prefix {mid}):\n")
    print(
        "| search | tree | τ | beside ms/pass here (cpu.yaml's) | vs specbeam's plain search "
        "| vs fairseq2's | with cpu.yaml's beside costs |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = [
        (name, configs[name].draft_shape(), tau, spec[name]) for name in SEARCHES for tau in taus[name]
    ]  # fmt: skip
    rows += [
        ("spec_beam, perfect draft", DraftShape(beam_size=k, depth=g, width=w), None, spec["spec_beam"])
        for g, w in PERFECT
    ]  # fmt: skip
    for name, shape, tau, run in rows:
        beam = shape.beam_size
        lean, fairseq2 = steps[beam]
        here = PlanCosts(
            target_cost, draft_cost,
            beside_calls_ms(target_cost, draft_cost, run.total_seconds, run.stats),
            lean - target_cost.ms(beam),
        )  # fmt: skip
        theirs = dataclasses.replace(
            here, accept_ms=stored.accept_ms, plain_step_ms=stored.plain_step_ms
        )
        expected = PassShape.perfect(shape) if tau is None else PassShape.expected(shape, tau)
        pass_ms = here.pass_ms(True, beam, 1, expected)
        print(
            f"| {name} | γ {shape.depth}, width {shape.width if shape.strategy != 'linear' else 1} "
            f"| {expected.tau:.2f} | {here.accept_ms:.2f} ({theirs.accept_ms:.2f}) "
            f"| {here.speedup(beam, expected):.2f}× | {fairseq2 * expected.tau / pass_ms:.2f}× "
            f"| {theirs.speedup(beam, expected):.2f}× |"
        )
    print("\n(measured τ of the random head, meaningless: " + ", ".join(
        f"{n} {r.stats.tau:.2f}" for n, r in spec.items()) + ")")  # fmt: skip


if __name__ == "__main__":
    main()
