"""The Performance issue's goals, measured: baseline and speculative side by side, in one run.

    .venv/bin/python scripts/bench.py --quick      # CI: tiny untrained models, 4 test sentences
    .venv/bin/python scripts/bench.py              # the embedded pair, every 7th test sentence
    .venv/bin/python scripts/bench.py --every 1    # the full test set
    .venv/bin/python scripts/bench.py --hardware calibrated --limit 300
    .venv/bin/python scripts/bench.py --draft ~/.cache/specbeam/head/best.pt   # another draft

Every comparison runs both methods on the same batches with the same models and threads
(`specbeam.apps.compare.run_side_by_side`). Efficiency is the measured speculation gain over
the one the planner's cost model predicts from the run's τ and trees: decoder calls timed
in this run, the steps and the work a pass does beside its calls calibrated on dev
sentences first (`PlanCosts.fit`, as `specbeam.calibrate` does). The ceiling table prices
trees a perfect draft would fill (`PassShape.perfect`) with the run's fitted costs: what a
better draft could gain on this machine, a prediction, not a measurement. Writes bench.md,
bench.json and bench.png to the output directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import torch
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.models.transformer import TransformerModel
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU
from tqdm import tqdm

from specbeam.apps.calibrate import (
    Calibration,
    CountingGenerator,
    ceiling_table,
    measure_call_costs,
)
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator
from specbeam.apps.evaluate import EvaluateConfig
from specbeam.integration.hub import is_path
from specbeam.integration.models import Draft, ModelPairConfig, open_pair
from specbeam.kernels.cpu import cpu_kind
from specbeam.kernels.runtime import Runtime
from specbeam.search.planner import LinearCost, PassShape

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]  # scripts run from a checkout


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
    file_lines: int = 0  # test verses of the whole-process translate runs; 0: none
    calibration: int = 10  # dev sentences that calibrate the cost model's work beside the calls


# Tiny models lose time to a second thread on a busy machine; short outputs keep CI fast.
QUICK = BenchSettings(
    limit=4, slot_counts=(1, 5, 10, 25), repeats=3, threads=1, max_gen_len=(0.5, 4),
    calibration=2,
)  # fmt: skip
# Every 7th test verse: 212 of the 1,481, from every book.
FULL = BenchSettings(
    limit=0, every=7, slot_counts=(1, 5, 10, 25, 50, 100), repeats=7, file_lines=300
)


def load_config(model: str, hardware: str) -> EvaluateConfig:
    """The task, model pair and hardware, composed by Hydra as the apps do."""
    try:
        with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base=None):
            cfg = compose("evaluate", overrides=[f"model={model}", f"hardware={hardware}"])
    except HydraException as error:
        raise SystemExit(f"error: {error}".splitlines()[0]) from None
    return OmegaConf.to_object(cfg)


@dataclass(frozen=True)
class Models:
    """The task's tokenizer and the model pair, loaded as the apps load them, on the
    threads and settings of `cfg.hardware` (applied first)."""

    cfg: EvaluateConfig
    tokenizer: Tokenizer
    target: TransformerModel
    draft: Draft | None

    @staticmethod
    def load(cfg: EvaluateConfig) -> Models:
        cfg.hardware.apply()
        pair = cfg.hardware.place(open_pair(
            cfg.model, cfg.task.src_lang, cfg.task.tgt_lang, with_draft=True,
            draft_dtype=cfg.hardware.draft_torch_dtype,
        ))  # fmt: skip
        return Models(cfg, pair.tokenizer, pair.target, pair.draft)

    def generator(self, d: DecodingConfig) -> Seq2SeqGenerator:
        """`d` on these models on the hardware's machine settings."""
        return make_generator(
            d, self.target, self.draft, self.tokenizer.vocab_info, self.cfg.hardware
        )


def check_checkpoints(model: ModelPairConfig) -> None:
    """Checkpoint paths only: an asset card's name is the model hub's to resolve."""
    for spec in (model.target, model.draft):
        if spec is not None and is_path(spec) and not (REPO_ROOT / spec).exists():
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
        speedup(beam, relaxed, f"{name}: wall time", 2.0),
        Goal(f"{name}: BLEU − beam BLEU", f"{bleu[0]:.2f}", f"{bleu[1]:.2f}", bleu[1] - bleu[0], -0.3),
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
    """One bar per goal with its value printed, the goal as a tick; labels wrapped so that
    the bars, not the names, get the width."""
    fig, ax = plt.subplots(figsize=(12, 0.62 * len(goals) + 1.5))
    y = range(len(goals))
    colours = ["tab:green" if g.met else "tab:red" for g in goals]
    ratios = [g.ratio for g in goals]
    ax.barh(y, ratios, color=colours)
    ax.scatter([g.target for g in goals], y, marker="|", s=400, color="black", label="goal")
    for i, g in enumerate(goals):
        bound = "≤" if g.at_most else "≥"
        ax.annotate(
            f"{g.ratio:.2f} (goal {bound} {g.target:g})", (max(g.ratio, 0.0), i),
            xytext=(4, 0), textcoords="offset points", va="center", fontsize=8,
        )  # fmt: skip
    ax.set_yticks(list(y), [textwrap.fill(g.name, 60) for g in goals], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(min(0.0, *ratios) - 0.1, 1.35 * max(*ratios, *(g.target for g in goals)))
    ax.set_xlabel("ratio (speculative ÷ baseline), τ, efficiency or BLEU difference")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def pass_breakdown(run: MethodRun, target: LinearCost) -> dict[str, float]:
    """Where the ms of an average speculative pass go: the target call's fixed and
    per-token parts (fitted as `target`), drafting, acceptance, cache commits and the rest."""
    s = run.stats
    passes = max(s.target_passes, 1)
    ms = {phase: 1000 * sec / passes for phase, sec in s.seconds.items()}
    slots = s.verified_slots / passes
    parts = {
        "target fixed": target.a,
        "target per token": target.b * slots,
        "draft": ms.get("draft", 0.0),
        "acceptance": ms.get("accept", 0.0),
        "cache commit": ms.get("commit", 0.0),
    }
    total = 1000 * run.total_seconds / passes
    parts["other"] = total - sum(parts.values())
    parts["pass"] = total
    parts["verified tokens"] = slots
    return parts


def cost_record(cal: Calibration, beam_size: int) -> dict[str, object]:
    """`cal` under the names bench.json has always used, so that runs compare across commits."""
    costs = cal.costs
    return {
        "verify": dataclasses.asdict(costs.target), "draft": dataclasses.asdict(costs.draft),
        "step_ms": cal.fairseq2_step_ms, "lean_step_ms": costs.plain_ms(beam_size),
        "beside_ms": costs.accept_ms, "points": cal.calls,
    }  # fmt: skip


def breakdown_table(rows: dict[str, dict[str, float]]) -> str:
    names = list(rows)
    keys = list(next(iter(rows.values())))
    lines = ["| ms per pass | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(f"{rows[n][key]:.2f}" for n in names) + " |")
    return "\n".join(lines)


def file_runs(
    lines: list[str], hardware: str, model: ModelPairConfig, out: Path, rounds: int
) -> Goal:
    """`python -m specbeam.translate input=FILE` with the defaults against `decoding=beam`:
    whole processes, as users run them, interleaved `rounds` times (start-up included)."""
    out.mkdir(parents=True, exist_ok=True)
    source = out / "file_run.es"
    source.write_text("\n".join(lines) + "\n")
    seconds: dict[str, list[float]] = {"default": [], "beam": []}
    outputs: dict[str, str] = {}
    for _ in tqdm(range(rounds), desc="file runs", unit="round", file=sys.stderr):
        for name, extra in (("beam", ["decoding=beam"]), ("default", [])):
            target = out / f"file_run.{name}.en"
            target.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "specbeam.translate", f"input={source}",
                   f"output={target}", f"hardware={hardware}", f"model={model.name}",
                   f"hydra.run.dir={out}/hydra_{name}", *extra]  # fmt: skip
            if model.draft is not None:
                cmd.append(f"model.draft={model.draft}")
            started = time.perf_counter()
            subprocess.run(cmd, cwd=REPO_ROOT, check=True, capture_output=True)
            seconds[name].append(time.perf_counter() - started)
            outputs[name] = target.read_text()
    base, ours = (statistics.median(seconds[n]) for n in ("beam", "default"))
    same = "identical" if outputs["beam"] == outputs["default"] else "DIFFERENT"
    return Goal(
        f"translate input=FILE ({len(lines)} test verses), defaults vs decoding=beam: "
        f"median of {rounds} whole runs, output {same}",
        f"{base:.1f} s", f"{ours:.1f} s", base / ours, 1.0,
    )  # fmt: skip


def bench(cfg: EvaluateConfig, settings: BenchSettings, out: Path) -> tuple[list[Goal], str]:
    """The goals, and the ceiling table."""
    stages = tqdm(total=6, desc="bench", unit="stage", file=sys.stderr)
    if settings.threads is not None:
        cfg.hardware.threads = settings.threads
    models = Models.load(cfg)
    tokenizer, target, draft = models.tokenizer, models.target, models.draft
    pairs = cfg.task.split("test")[:: settings.every][: settings.limit or None]
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    base_names = ["beam", "beam_lean", "spec_beam", "greedy", "spec_greedy", "relaxed"]
    decodings = {n: cfg.hardware.tune(load_decoding(n)) for n in base_names}
    spec = decodings["spec_beam"]
    # Speculation itself, without the planner; and as before this issue (fairseq2's
    # modules for the target) for the pass breakdown.
    decodings["spec_beam_always"] = dataclasses.replace(spec, name="spec_beam_always", plan=False)
    decodings["spec_beam_fairseq2_target"] = dataclasses.replace(
        spec, name="spec_beam_fairseq2_target", plan=False, lean_target=False
    )
    decodings["spec_greedy_always"] = dataclasses.replace(
        decodings["spec_greedy"], name="spec_greedy_always", plan=False
    )
    # Per-pass gating (planner.Gate), with the per-call planner and without it.
    decodings["spec_beam_gated"] = dataclasses.replace(spec, name="spec_beam_gated", gate=True)
    decodings["spec_beam_gated_always"] = dataclasses.replace(
        spec, name="spec_beam_gated_always", gate=True, plan=False
    )
    if settings.max_gen_len is not None:
        for d in decodings.values():
            d.max_gen_len = list(settings.max_gen_len)

    def method(name: str) -> MethodRun:
        gen = models.generator(decodings[name])
        return MethodRun(name, CountingGenerator(gen) if name == "beam" else gen)

    stages.update()
    encode = tokenizer.create_encoder(lang=cfg.task.src_lang, mode="source")
    with Runtime(cfg.hardware.runtime_config()).active():
        points = measure_call_costs(
            target, draft, encode(sorted(sources, key=len)[len(sources) // 2]), hyps=spec.beam_size,
            prefix_len=settings.prefix_len, slot_counts=settings.slot_counts,
            repeats=settings.repeats, lean_draft=spec.lean_draft, lean_target=spec.lean_target,
        )  # fmt: skip
    # The cost model's steps and work beside the calls, calibrated on dev sentences as
    # `specbeam.calibrate` does, so that the test verses' speculation gain is predicted,
    # not fitted.
    dev = [p.source for p in cfg.task.split("dev")[: settings.calibration]]
    dev_runs = [method(n) for n in ("beam", "beam_lean", "spec_beam_always")]
    run_side_by_side(
        dev_runs, tokenizer, dev, cfg.task.src_lang, cfg.task.tgt_lang,
        batch_size=1, desc="calibration (dev)",
    )  # fmt: skip
    calibrated = Calibration.of(points, spec.beam_size, *dev_runs[:2], dev_runs[2:])
    stages.update()
    single = {n: method(n) for n in decodings}
    run_side_by_side(
        list(single.values()), tokenizer, sources, cfg.task.src_lang, cfg.task.tgt_lang,
        batch_size=1, desc="batch 1",
    )  # fmt: skip
    stages.update()
    n = settings.batch_size
    batched = {m: method(m) for m in ("beam", "beam_lean", "spec_beam", "spec_beam_always")}
    run_side_by_side(
        list(batched.values()), tokenizer, sources, cfg.task.src_lang, cfg.task.tgt_lang,
        batch_size=n, desc=f"batch {n}",
    )  # fmt: skip
    stages.update()
    file_goal = (
        file_runs(sources[: settings.file_lines], cfg.hardware.name, cfg.model, out, 2)
        if settings.file_lines
        else None
    )
    stages.update()
    stages.close()

    always = single["spec_beam_always"]
    k = spec.beam_size
    fitted = Calibration.of(points, k, single["beam"], single["beam_lean"], [always])  # this run's
    cost = fitted.costs
    profile = PassShape.of(always.stats)
    # Speculation against the plain search it replaces (specbeam's lean one), priced as
    # the planner prices it, from the calibration and this run's τ and trees.
    predicted = calibrated.costs.speedup(k, profile)
    beam, lean, planned = single["beam"], single["beam_lean"], single["spec_beam"]
    sent_s = {m: len(sources) / r.total_seconds for m, r in batched.items()}
    kv = [max(a.peak_cache_bytes, b.peak_cache_bytes) / 2**20 for a, b in
          ((single["beam"], batched["beam"]), (always, batched["spec_beam_always"]))]  # fmt: skip
    plain_share = planned.stats.plain_sources / len(sources)
    goals = [
        speedup(beam, planned, f"spec_beam {k} as configured (planner: {plain_share:.0%} of sentences plain), batch 1: wall time", 1.3),
        exact(beam, planned, f"spec_beam {k} as configured, batch 1: identical output"),
        speedup(beam, lean, f"kernel gain: specbeam's plain beam {k} (lean) vs fairseq2's, batch 1", 1.0),
        exact(beam, lean, f"specbeam's plain beam {k} (lean), batch 1: identical output"),
        speedup(lean, always, f"speculation gain: spec_beam {k} always speculating vs lean plain, batch 1", 1.0),
        exact(beam, always, f"spec_beam {k} always speculating, batch 1: identical output"),
        speedup(lean, single["spec_beam_gated"], f"per-pass gating: spec_beam {k} gated, planner on, vs lean plain, batch 1", 1.0),
        exact(beam, single["spec_beam_gated"], f"spec_beam {k} gated, planner on, batch 1: identical output"),
        speedup(lean, single["spec_beam_gated_always"], f"per-pass gating: spec_beam {k} gated, every call speculating, vs lean plain, batch 1", 1.0),
        exact(beam, single["spec_beam_gated_always"], f"spec_beam {k} gated, every call speculating, batch 1: identical output"),
        Goal(f"spec beam {k}, batch 1: τ at γ={spec.gamma}" + (f" (adaptive in {spec.gamma_bounds})" if spec.gamma_bounds else ""),
             "1.00", f"{profile.tau:.2f}", profile.tau, 4.0),
        Goal("efficiency: measured ÷ predicted speculation gain", f"{predicted:.2f}× predicted",
             f"{lean.total_seconds / always.total_seconds:.2f}× measured",
             lean.total_seconds / always.total_seconds / predicted, 0.9),
        Goal(f"spec_beam {k} as configured, batches of {n}: sentences/s vs beam", f"{sent_s['beam']:.2f}/s",
             f"{sent_s['spec_beam']:.2f}/s", sent_s["spec_beam"] / sent_s["beam"], 1.0),
        Goal(f"spec_beam {k} always speculating, batches of {n}: sentences/s vs beam", f"{sent_s['beam']:.2f}/s",
             f"{sent_s['spec_beam_always']:.2f}/s", sent_s["spec_beam_always"] / sent_s["beam"], 1.0),
        speedup(single["greedy"], single["spec_greedy"], "spec greedy as configured vs greedy, batch 1: wall time", 2.0),
        speedup(single["greedy"], single["spec_greedy_always"], "spec greedy always speculating vs greedy, batch 1: wall time", 2.0),
        *relaxed_goals(single, refs, k),
        Goal("peak KV cache, self + cross attention (target + draft) ÷ beam's", f"{kv[0]:.2f} MB", f"{kv[1]:.2f} MB",
             kv[1] / kv[0], 2.0, at_most=True),
    ]  # fmt: skip
    if file_goal is not None:
        goals.append(file_goal)
    breakdown = {
        "fairseq2 target modules": pass_breakdown(single["spec_beam_fairseq2_target"], cost.target),
        "lean target": pass_breakdown(always, cost.target),
    }
    ceiling = ceiling_table(cost, k, fitted.fairseq2_step_ms, ("today, measured τ", profile))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(
        f"`lscpu`: {cpu_kind()}, {cfg.hardware.threads} threads, {len(sources)} test sentences\n\n"
        + markdown(goals)
        + "\n\nA speculative pass at batch 1 (spec_beam always speculating), "
        f"target call fitted as {cost.target.a:.2f} + {cost.target.b:.3f}·T ms:\n\n"
        + breakdown_table(breakdown)
        + "\n\nThe ceiling: a perfect draft's trees priced with this run's costs, batch 1 "
        "(predicted, not measured):\n\n" + ceiling + "\n"
    )
    record = {
        "cpu": cpu_kind(), "model": cfg.model.name, "hardware": dataclasses.asdict(cfg.hardware),
        "sentences": len(sources), "decodings": {n: dataclasses.asdict(d) for n, d in decodings.items()},
        "cost_model": cost_record(fitted, k), "calibrated_costs": cost_record(calibrated, k),
        "pass_profile": dataclasses.asdict(profile),
        "lean_plain_step_ms": cost.plain_ms(k), "pass_breakdown": breakdown,
        "plain_step_overhead_ms": cost.plain_step_ms,
        "accept_ms_per_source_pass": 1000 * always.stats.seconds["accept"] / max(always.stats.source_passes, 1),
        "goals": [{**dataclasses.asdict(g), "met": g.met} for g in goals],
    }  # fmt: skip
    (out / "bench.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(goals, out / "bench.png")
    return goals, ceiling


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: 4 sentences, tiny_random")
    parser.add_argument("--model", help="conf/model/<name>.yaml (default: bible_es_en; "
                        "tiny_random with --quick)")  # fmt: skip
    parser.add_argument("--hardware", default="cpu", help="conf/hardware/<name>.yaml")
    parser.add_argument("--draft", help="a draft or head checkpoint in place of the model's")
    parser.add_argument("--every", type=int, help="every n-th test sentence (default: 7)")
    parser.add_argument("--limit", type=int, help="at most n sentences (default: all)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench_out")
    parser.add_argument("--file-lines", type=int, help="test verses of the whole-process "
                        "translate runs (default: 300; 0: skip)")  # fmt: skip
    args = parser.parse_args()
    settings = QUICK if args.quick else FULL
    if args.limit is not None:
        settings = dataclasses.replace(settings, limit=args.limit)
    if args.every is not None:
        settings = dataclasses.replace(settings, every=args.every)
    if args.file_lines is not None:
        settings = dataclasses.replace(settings, file_lines=args.file_lines)
    model = args.model or ("tiny_random" if args.quick else "bible_es_en")
    cfg = load_config(model, args.hardware)
    if args.draft:
        cfg.model.draft = str(Path(args.draft).expanduser().resolve())
    check_checkpoints(cfg.model)
    torch.manual_seed(0)
    try:
        goals, ceiling = bench(cfg, settings, args.out)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"error: {error}") from None
    print(markdown(goals))
    print(f"\nThe ceiling (predicted):\n\n{ceiling}")
    print(f"\nwrote {args.out}/bench.md, bench.json, bench.png")


if __name__ == "__main__":
    main()
