"""The Performance issue's goals, measured: baseline and speculative side by side, in one run.

    .venv/bin/python scripts/bench.py --quick      # CI: tiny untrained models, 4 test sentences
    .venv/bin/python scripts/bench.py              # the embedded pair, every 7th test sentence
    .venv/bin/python scripts/bench.py --every 1    # the full test set (about an hour)
    .venv/bin/python scripts/bench.py --hardware calibrated --limit 300

Every comparison runs both methods on the same batches with the same models and threads
(`specbeam.apps.compare.run_side_by_side`). Efficiency is the measured speedup over the one
`specbeam.calibrate`'s cost model predicts from the run's own τ and pass profile. Writes
bench.md, bench.json and bench.png to the output directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU
from tqdm import tqdm

from specbeam.apps.calibrate import (
    CostModel,
    CountingGenerator,
    PassProfile,
    fit_linear,
    measure_call_costs,
    predict_speedup,
    step_ms,
)
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator
from specbeam.apps.evaluate import EvaluateConfig
from specbeam.apps.paths import REPO_ROOT
from specbeam.integration.models import ModelPairConfig, load_pair

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@dataclass(frozen=True)
class Goal:
    name: str
    baseline: str  # the baseline's figure, with its unit
    speculative: str
    ratio: float
    target: float
    at_most: bool = False  # the ratio must be ≤ target (else ≥)

    @property
    def met(self) -> bool:
        return self.ratio <= self.target if self.at_most else self.ratio >= self.target


@dataclass(frozen=True)
class BenchSettings:
    limit: int  # test sentences; 0 = all
    slot_counts: tuple[int, ...]
    repeats: int
    every: int = 1  # every n-th test sentence (all books, in a fraction of the time)
    prefix_len: int = 20
    batch_size: int = 16
    threads: int | None = None  # None: the hardware config's
    max_gen_len: tuple[float, int] | None = None  # None: the decoding configs'


# Tiny models lose time to a second thread on a busy machine; short outputs keep CI fast.
QUICK = BenchSettings(
    limit=4, slot_counts=(1, 5, 10, 25), repeats=3, threads=1, max_gen_len=(0.5, 4)
)
# 212 of the 1,481 test verses, from every book: the six methods at batch 1 and two at
# batch 16 take about a quarter of an hour on two cores.
FULL = BenchSettings(limit=0, every=7, slot_counts=(1, 5, 10, 25, 50, 100), repeats=7)


def load_config(model: str, hardware: str) -> EvaluateConfig:
    """The task, model pair and hardware, composed by Hydra as the apps do."""
    try:
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
            cfg = compose("evaluate", overrides=[f"model={model}", f"hardware={hardware}"])
    except HydraException as error:
        raise SystemExit(f"error: {error}".splitlines()[0]) from None
    return OmegaConf.to_object(cfg)


def check_checkpoints(model: ModelPairConfig) -> None:
    for spec in (model.target, model.draft):
        if spec is not None and spec != "random" and not (REPO_ROOT / spec).exists():
            raise SystemExit(
                f"error: model {model.name}: checkpoint {spec} does not exist yet; "
                "try --model tiny_random"
            )


def speedup(base: MethodRun, spec: MethodRun, name: str, target: float) -> Goal:
    return Goal(
        name, f"{base.total_seconds:.2f} s", f"{spec.total_seconds:.2f} s",
        base.total_seconds / spec.total_seconds, target,
    )  # fmt: skip


def exact(base: MethodRun, spec: MethodRun, name: str) -> Goal:
    same = sum(a == b for a, b in zip(base.tokens, spec.tokens, strict=True)) / len(base.tokens)
    return Goal(name, "–", f"{same:.3f} identical", same, 1.0)


def relaxed_goals(runs: dict[str, MethodRun], refs: list[str], k: int) -> list[Goal]:
    name = f"relaxed beam {k}, batch 1"
    beam, relaxed = runs["beam"], runs["relaxed"]
    bleu = [BLEU().corpus_score(r.outputs, [refs]).score for r in (beam, relaxed)]
    return [
        speedup(beam, relaxed, f"{name}: wall time", 3.0),
        Goal(f"{name}: BLEU − beam BLEU", f"{bleu[0]:.2f}", f"{bleu[1]:.2f}", bleu[1] - bleu[0], -0.5),
    ]  # fmt: skip


def markdown(goals: list[Goal]) -> str:
    lines = [
        "| goal | baseline | speculative | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for g in goals:
        met = "yes" if g.met else "no"
        bound = f"{'≤' if g.at_most else '≥'} {g.target:g}"
        lines.append(
            f"| {g.name} | {g.baseline} | {g.speculative} | {g.ratio:.2f} | {bound} | {met} |"
        )
    return "\n".join(lines)


def plot(goals: list[Goal], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(goals) + 1.5))
    y = range(len(goals))
    colours = ["tab:green" if g.met else "tab:red" for g in goals]
    ax.barh(y, [g.ratio for g in goals], color=colours)
    ax.scatter([g.target for g in goals], y, marker="|", s=400, color="black", label="goal")
    ax.set_yticks(list(y), [g.name for g in goals])
    ax.invert_yaxis()
    ax.set_xlabel("ratio (speculative ÷ baseline; τ; efficiency; BLEU delta)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench(cfg: EvaluateConfig, settings: BenchSettings, out: Path) -> list[Goal]:
    stages = tqdm(total=4, desc="bench", unit="stage", file=sys.stderr)
    if settings.threads is not None:
        cfg.hardware.threads = settings.threads
    cfg.hardware.apply()
    tokenizer = cfg.task.load_tokenizer()
    target, draft = load_pair(
        cfg.model, tokenizer.vocab_info.size, with_draft=True,
        draft_dtype=cfg.hardware.draft_torch_dtype,
    )  # fmt: skip
    pairs = cfg.task.split("test")[:: settings.every][: settings.limit or None]
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    names = ["beam", "spec_beam", "greedy", "spec_greedy", "relaxed"]
    decodings: dict[str, DecodingConfig] = {n: cfg.hardware.tune(load_decoding(n)) for n in names}
    # Adaptive γ against fixed γ: spec_beam is one of the two (as tuned), the other is added.
    spec = decodings["spec_beam"]
    bounds = spec.gamma_bounds or [1, 2 * spec.gamma]
    other = "spec_beam_fixed" if spec.gamma_bounds else "spec_beam_adaptive"
    names.append(other)
    decodings[other] = dataclasses.replace(
        spec, name=other, gamma_bounds=None if spec.gamma_bounds else bounds
    )
    fixed, adaptive = (
        ("spec_beam_fixed", "spec_beam") if spec.gamma_bounds else ("spec_beam", other)
    )
    if settings.max_gen_len is not None:
        for d in decodings.values():
            d.max_gen_len = list(settings.max_gen_len)

    def method(name: str) -> MethodRun:
        gen = make_generator(
            decodings[name], target, draft, tokenizer.vocab_info,
            memory_budget_bytes=cfg.hardware.memory_budget_bytes,
        )  # fmt: skip
        return MethodRun(name, CountingGenerator(gen) if name == "beam" else gen)

    stages.update()
    spec = decodings["spec_beam"]
    encode = tokenizer.create_encoder(lang=cfg.task.src_lang, mode="source")
    points = measure_call_costs(
        target, draft, encode(sorted(sources, key=len)[len(sources) // 2]), hyps=spec.beam_size,
        prefix_len=settings.prefix_len, slot_counts=settings.slot_counts, repeats=settings.repeats,
        lean_draft=spec.lean_draft,
    )  # fmt: skip
    stages.update()
    single = {n: method(n) for n in names}
    run_side_by_side(
        list(single.values()), tokenizer, sources, cfg.task.src_lang, cfg.task.tgt_lang,
        batch_size=1, desc="batch 1",
    )  # fmt: skip
    stages.update()
    # The batch goal measures speculation itself, whatever limit the hardware config sets.
    decodings["spec_beam"] = dataclasses.replace(spec, max_speculative_batch=0)
    batched = {n: method(n) for n in ("beam", "spec_beam")}
    run_side_by_side(
        list(batched.values()), tokenizer, sources, cfg.task.src_lang, cfg.task.tgt_lang,
        batch_size=settings.batch_size, desc=f"batch {settings.batch_size}",
    )  # fmt: skip
    stages.update()
    stages.close()

    fits = {m: fit_linear(list(ms), list(ms.values())) for m, ms in points.items()}
    cost = CostModel(fits["target"], fits["draft"], step_ms(single["beam"]), points)
    profile = PassProfile.of(single["spec_beam"].stats)
    predicted = predict_speedup(cost, profile)
    beam, spec_run = single["beam"], single["spec_beam"]
    measured = beam.total_seconds / spec_run.total_seconds
    k, n = spec.beam_size, settings.batch_size
    sent_s = [len(sources) / r.total_seconds for r in batched.values()]
    kv = [max(a.peak_cache_bytes, b.peak_cache_bytes) / 2**20 for a, b in
          ((single["beam"], batched["beam"]), (spec_run, batched["spec_beam"]))]  # fmt: skip
    goals = [
        speedup(beam, spec_run, f"spec beam {k}, batch 1: wall time", 2.0),
        exact(beam, spec_run, f"spec beam {k}, batch 1: identical output"),
        Goal(f"spec beam {k}, batch 1: τ at γ={spec.gamma}" + (f" (adaptive in [{bounds[0]}, {bounds[1]}])" if spec.gamma_bounds else ""), "1.00", f"{profile.tau:.2f}",
             profile.tau, 4.0),
        Goal("efficiency: measured ÷ predicted speedup", f"{predicted:.2f}× predicted",
             f"{measured:.2f}× measured", measured / predicted, 0.85),
        Goal(f"spec beam {k}, batches of {n}: sentences/s", f"{sent_s[0]:.2f}/s",
             f"{sent_s[1]:.2f}/s", sent_s[1] / sent_s[0], 1.2),
        speedup(single[fixed], single[adaptive],
                f"adaptive γ ∈ [{bounds[0]}, {bounds[1]}] vs fixed γ={spec.gamma}, batch 1: wall time", 1.0),
        speedup(single["greedy"], single["spec_greedy"], "spec greedy vs greedy, batch 1: wall time", 2.5),
        *relaxed_goals(single, refs, k),
        Goal("peak KV cache, self + cross attention (target + draft) ÷ beam's", f"{kv[0]:.2f} MB", f"{kv[1]:.2f} MB",
             kv[1] / kv[0], 2.0, at_most=True),
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(markdown(goals) + "\n")
    record = {
        "model": cfg.model.name, "hardware": dataclasses.asdict(cfg.hardware),
        "sentences": len(sources), "decodings": {n: dataclasses.asdict(d) for n, d in decodings.items()},
        "cost_model": dataclasses.asdict(cost), "pass_profile": dataclasses.asdict(profile),
        "goals": [{**dataclasses.asdict(g), "met": g.met} for g in goals],
    }  # fmt: skip
    (out / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(goals, out / "bench.png")
    return goals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: 4 sentences, tiny_random")
    parser.add_argument("--model", help="conf/model/<name>.yaml (default: bible_es_en; "
                        "tiny_random with --quick)")  # fmt: skip
    parser.add_argument("--hardware", default="cpu", help="conf/hardware/<name>.yaml")
    parser.add_argument("--every", type=int, help="every n-th test sentence (default: 7)")
    parser.add_argument("--limit", type=int, help="at most n sentences (default: all)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench_out")
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    if args.limit is not None:
        settings = dataclasses.replace(settings, limit=args.limit)
    if args.every is not None:
        settings = dataclasses.replace(settings, every=args.every)
    model = args.model or ("tiny_random" if args.quick else "bible_es_en")
    cfg = load_config(model, args.hardware)
    check_checkpoints(cfg.model)
    torch.manual_seed(0)
    try:
        goals = bench(cfg, settings, args.out)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    print(markdown(goals))
    print(f"\nwrote {args.out}/bench.md, bench.json, bench.png")


if __name__ == "__main__":
    main()
