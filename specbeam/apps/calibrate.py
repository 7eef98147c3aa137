"""Calibration: this machine's cost model, and the draft depth and width it favours.

    python -m specbeam.calibrate                          # embedded pair, writes ~/.config/specbeam/hardware/calibrated.yaml
    python -m specbeam.calibrate model=tiny_random name=test 'gammas=[2,4]' sample=3

Measures the target's verification cost per call as a line in its query slots, the
draft's per call the same way, and the cost per step of fairseq2's beam search and of
specbeam's own plain search; runs the speculative decoding for a grid of γ × draft width
on a dev sample for τ, the slots and draft calls of a pass, and the work a pass does
beside its calls; and predicts, as the planner (`specbeam.search.planner`) does,

    speedup = τ · lean_step_ms / (verify_ms(slots) + draft calls · draft_ms(nodes) + beside_ms)

against specbeam's plain search, which the planner falls back to. The cell with the best
measured speedup (every cell and both plain searches decode the same sentences,
interleaved) is written as `tuned` settings of a hardware config, with the planner's
`costs`; the prediction is printed beside it to show why, and where the cost model is off.
Last comes the ceiling: trees a perfect draft would fill, priced with the same costs, and
the τ each needs to break even, against the best cell's.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import final

import hydra
import torch
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput
from fairseq2.models.seq2seq import Seq2SeqModel
from fairseq2.models.transformer import TransformerModel
from fairseq2.nn import BatchLayout
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from torch import Tensor
from torch.utils.hooks import RemovableHandle
from tqdm import tqdm
from typing_extensions import override

from specbeam.apps.app import before_hydra, run_app
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator, reaching
from specbeam.apps.hardware import HardwareConfig
from specbeam.data.batches import pad
from specbeam.data.task import TaskConfig
from specbeam.integration.models import Draft, ModelPairConfig, open_pair
from specbeam.kernels.runtime import Runtime
from specbeam.paths import SHIPPED, shipped, user_config_dir, user_path
from specbeam.plural import counted
from specbeam.search.draft import DraftShape
from specbeam.search.planner import PassShape, PlanCosts, beside_calls_ms
from specbeam.search.slots import SlotTable
from specbeam.search.tree_attention import TreeDecoder


@final
class CallTimer:
    """Times one decoder call over T new query tokens of one source whose k hypotheses
    each have `prefix_len` cached positions: the embedding, the tree-masked decoder
    (TreeDecoder.forward) and the projection of every slot, as verification does them.
    The call is rolled back afterwards, so every call sees the same prefix. Token ids
    are arbitrary: they do not change the cost."""

    def __init__(
        self,
        model: Draft,
        source: Tensor,
        *,
        hyps: int,
        prefix_len: int,
        max_slots: int,
        encoder_output: Tensor | None = None,
        lean: bool = False,
    ) -> None:
        src, layout = pad([source], 0)
        capacity = prefix_len + -(-max_slots // hyps) + 1
        self.decoder = TreeDecoder(
            model, src, layout, hyps_per_source=hyps, capacity=capacity,
            encoder_output=encoder_output, lean=lean,
        )  # fmt: skip
        self.vocab_size = model.final_proj.output_dim
        self.gen = torch.Generator().manual_seed(0)
        self.origin = torch.arange(hyps)[None]  # every hypothesis keeps its own prefix
        _, keep = self._decode(hyps, prefix_len)
        self.decoder.cache.commit(self.origin, keep)

    def _decode(self, chains: int, length: int) -> tuple[float, Tensor]:
        """Decodes `chains` chains of `length` tokens: seconds, and which slots each
        chain's last token sees (its chain), (1, chains, chains · length)."""
        dec = self.decoder
        tokens = torch.randint(4, self.vocab_size, (1, chains, length), generator=self.gen)
        table = SlotTable(1, chains * length, tokens.device)
        roots = table.add_chains(tokens, torch.full((1,), length), dec.cache.lens)
        # A head's parent states: any values cost the same.
        features = torch.randn((1, table.size, dec.model.model_dim)) if dec.reads_features else None
        started = time.perf_counter()
        dec.logits(dec.forward(*table.query(0, table.size), features=features))
        seconds = time.perf_counter() - started
        return seconds, table.visible[torch.zeros_like(roots), roots, : table.size]

    def __call__(self, slots: int) -> float:
        """Seconds of one call over `slots` query tokens; nothing is kept."""
        seconds, _ = self._decode(1, slots)
        self.decoder.cache.commit(
            self.origin, torch.zeros((1, len(self.origin[0]), slots), dtype=torch.bool)
        )
        return seconds


@torch.inference_mode()
def measure_call_costs(
    target: TransformerModel,
    draft: Draft,
    source: Tensor,
    *,
    hyps: int,
    prefix_len: int,
    slot_counts: Sequence[int],
    repeats: int,
    lean_draft: bool = True,
    lean_target: bool = True,
) -> dict[str, dict[int, float]]:
    """Median ms per call of "target" and "draft" for every T; calls are interleaved
    (target, draft, every T, in turn) and repeated, so machine noise falls alike.
    `lean_draft`, `lean_target`: the decoders as the generators run them."""
    timers = {"target": CallTimer(target, source, hyps=hyps, prefix_len=prefix_len,
                                  max_slots=max(slot_counts), lean=lean_target)}  # fmt: skip
    shared = draft.encoder is target.encoder
    timers["draft"] = CallTimer(
        draft, source, hyps=hyps, prefix_len=prefix_len, max_slots=max(slot_counts),
        encoder_output=timers["target"].decoder.encoder_output if shared else None,
        lean=lean_draft,
    )  # fmt: skip
    for timer in timers.values():  # warm-up: first calls allocate
        timer(max(slot_counts))
    samples: dict[str, dict[int, list[float]]] = {m: {t: [] for t in slot_counts} for m in timers}
    for _ in tqdm(range(repeats), desc="decoder calls", unit="round", file=sys.stderr):
        for t in slot_counts:
            for name, timer in timers.items():
                samples[name][t].append(1000 * timer(t))
    return {m: {t: statistics.median(v) for t, v in s.items()} for m, s in samples.items()}


@final
class CountingGenerator(Seq2SeqGenerator):
    """A plain generator that counts its model's decoder calls (prefill and steps)."""

    def __init__(self, inner: Seq2SeqGenerator) -> None:
        self.inner = inner
        self.calls = 0

    @property
    @override
    def model(self) -> Seq2SeqModel:
        return self.inner.model

    @override
    def register_step_hook(self, hook) -> RemovableHandle:  # noqa: ANN001
        return self.inner.register_step_hook(hook)

    def _count(self, *_: object) -> None:
        self.calls += 1

    @override
    def __call__(
        self,
        source_seqs: Tensor,
        source_seqs_layout: BatchLayout,
        prompt_seqs: Tensor | None,
        prompt_seqs_layout: BatchLayout | None,
    ) -> SequenceGeneratorOutput:
        handle = self.inner.model.decoder.register_forward_hook(self._count)
        try:
            return self.inner(source_seqs, source_seqs_layout, prompt_seqs, prompt_seqs_layout)
        finally:
            handle.remove()


def step_ms(run: MethodRun) -> float:
    """Milliseconds per target decoder call of a run of a `CountingGenerator`."""
    assert isinstance(run.generator, CountingGenerator)
    return 1000 * run.total_seconds / max(run.generator.calls, 1)


@dataclass(frozen=True)
class Calibration:
    """The planner's costs as fitted, with the timings a report shows beside them."""

    costs: PlanCosts
    calls: dict[str, dict[int, float]]  # model -> query tokens -> median ms per call
    fairseq2_step_ms: float  # fairseq2's beam search per decoder call: the users' baseline
    raised: str | None = None  # why work beside the calls was written as 0, if it was

    @classmethod
    def of(
        cls,
        calls: dict[str, dict[int, float]],
        beam_size: int,
        fairseq2: MethodRun,
        lean: MethodRun,
        speculative: Sequence[MethodRun],
    ) -> Calibration:
        """`PlanCosts.fit` of timed calls (`measure_call_costs`) and batch-1 runs over the
        same sentences: fairseq2's beam search (a `CountingGenerator`, counting the
        steps), specbeam's plain one (same output, so as many steps) and speculative runs."""
        assert isinstance(fairseq2.generator, CountingGenerator)
        costs = PlanCosts.fit(
            calls, beam_size, lean.total_seconds, fairseq2.generator.calls,
            [(run.total_seconds, run.stats) for run in speculative],
        )  # fmt: skip
        return cls(costs, calls, step_ms(fairseq2))


@final
class OtherLoad:
    """The CPU time other processes take from its making on (Linux's /proc/stat less this
    process's own): on a shared machine they slow the timed calls and the searches
    unevenly, which skews the work beside the calls."""

    def __init__(self) -> None:
        self.start = (time.monotonic(), _busy_cpu_seconds(), _own_cpu_seconds())

    def cpus(self) -> float | None:
        """The CPUs other processes kept busy on average since; None where unknown."""
        wall, busy, own = self.start
        now = _busy_cpu_seconds()
        elapsed = time.monotonic() - wall
        if busy is None or now is None or elapsed <= 0:
            return None
        return max(now - busy - (_own_cpu_seconds() - own), 0.0) / elapsed


def _busy_cpu_seconds() -> float | None:
    """Seconds every CPU spent on work since boot (/proc/stat: all but idle and iowait)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def trusted(cal: Calibration, path: Path, others: float | None, busy_cpus: float) -> Calibration:
    """`cal`, or a ValueError naming `path` (then not written) where a cost cannot be
    trusted: a call fitted to cost nothing, or work beside the calls negative while other
    processes (`others`: the CPUs they kept busy, None: unknown) kept `busy_cpus` busy.
    Negative work on an otherwise idle machine is a timed call costing more than the same
    call inside a search (a large target's, docs/dense_600m.md; a tiny one's): raised to
    0, and `raised` says so, so that the costs printed are those written."""
    c = cal.costs
    free = [m for m, cost in (("target", c.target), ("draft", c.draft))
            if min(cost.ms(t) for t in cal.calls[m]) <= 0]  # fmt: skip
    beside = {"per speculative pass": c.accept_ms, "per plain step": c.plain_step_ms}
    negative = ", ".join(f"{ms:.2f} ms {what}" for what, ms in beside.items() if ms < 0)
    busy = others is not None and others >= busy_cpus
    if free or (negative and busy):
        cause = (
            f"other processes kept {others:.1f} of this machine's {os.cpu_count()} CPUs busy "
            "on average while it measured"
            if others is not None and others >= 0.1
            else "the machine's speed changed while it measured"
        )
        found = (
            f"a {free[0]} call fitted to cost nothing, as its timings varied more than it costs"
            if free
            else f"the work beside the calls came out negative ({negative}), as the timed "
            "calls and the searches ran at different speeds"
        )
        raise ValueError(
            f"calibration cannot be trusted, so {path} was not written: {found} ({cause}); "
            "run it again on an idle machine"
        )
    if not negative:
        return cal
    raised = dataclasses.replace(
        c, accept_ms=max(c.accept_ms, 0.0), plain_step_ms=max(c.plain_step_ms, 0.0)
    )
    note = (
        f"work beside the calls written as 0 where it came out negative ({negative}): a timed "
        "call costs more than the same call inside a search"
    )
    return dataclasses.replace(cal, costs=raised, raised=note)


@dataclass(kw_only=True)
class CalibrateConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    name: str = "calibrated"
    """Writes <hardware_dir>/<name>.yaml (the current hardware config plus `tuned`)."""
    hardware_dir: str | None = None
    """None: the per-user hardware configs (`~/.config/specbeam/hardware`, under
    $XDG_CONFIG_HOME if set), where every app's `hardware=<name>` finds it; a relative
    path is relative to the working directory."""
    method: str = "spec_beam"
    """The speculative decoding to tune (conf/decoding/<method>.yaml); plain beam search
    of its beam size is the baseline. Not `decoding=`: that is the apps' config group."""
    split: str = "dev"
    """The task's split whose first `sample` sentences are decoded."""
    sample: int = 20
    """Sentences of the split run for τ (batch 1) and the beam-search step cost."""
    gammas: list[int] = field(default_factory=lambda: [2, 3, 4, 5, 6, 7, 8])
    """Draft depths γ of the grid, each run with every one of `draft_widths`."""
    draft_widths: list[int] = field(default_factory=lambda: [5, 10])
    """Draft widths (nodes kept per tree level) of the grid, each ≥ the decoding's beam_size."""
    slot_counts: list[int] = field(default_factory=lambda: [1, 5, 10, 25, 50, 100])
    """Query tokens per timed decoder call (the fit's x values)."""
    prefix_len: int = 20
    """Cached positions per hypothesis during timed calls (a mid-sentence prefix)."""
    repeats: int = 7
    """Timed rounds of decoder calls per query-token count; a call's cost is their median."""
    busy_cpus: float = 0.5
    """Negative work beside the calls, measured while other processes kept this many CPUs
    busy on average (/proc/stat), is refused: nothing is written. On a quieter machine it
    is written as 0 (a timed call costing more than inside a search)."""


ConfigStore.instance().store(name="calibrate_schema", node=CalibrateConfig)


@dataclass(frozen=True)
class GridRow:
    gamma: int
    draft_width: int
    shape: PassShape
    accept_ms: float  # acceptance and cache commits per pass, measured
    beside_ms: float  # per pass, beyond the calls
    break_even_tau: float  # the τ at which this cell's passes would match plain search
    predicted: float  # over specbeam's plain search, by the cost model
    measured: float  # specbeam's plain search's seconds ÷ this setting's (same sentences)
    vs_fairseq2: float  # fairseq2's beam search's seconds ÷ this setting's


def at_gamma(decoding: DecodingConfig, gamma: int, draft_width: int) -> DecodingConfig:
    """`decoding` at a grid cell: adaptive bounds that leave out γ widen to reach it."""
    bounds = reaching(decoding.gamma_bounds, gamma)
    return dataclasses.replace(decoding, gamma=gamma, draft_width=draft_width, gamma_bounds=bounds)


def run_grid(
    cfg: CalibrateConfig,
    decoding: DecodingConfig,
    target: TransformerModel,
    draft: TransformerModel,
    tokenizer: Tokenizer,
    sources: list[str],
) -> tuple[Calibration, list[GridRow]]:
    """Plain beam search and every grid setting on the same sentences at batch 1,
    interleaved; the call costs are measured first on a typical sentence."""
    encode = tokenizer.create_encoder(lang=cfg.task.src_lang, mode="source")
    typical = sorted(sources, key=len)[len(sources) // 2]
    load = OtherLoad()
    with Runtime(cfg.hardware.runtime_config()).active():
        points = measure_call_costs(
            target, draft, encode(typical), hyps=decoding.beam_size, prefix_len=cfg.prefix_len,
            slot_counts=cfg.slot_counts, repeats=cfg.repeats, lean_draft=decoding.lean_draft,
            lean_target=decoding.lean_target,
        )  # fmt: skip
    k = decoding.beam_size
    # The grid measures speculation itself: no planner chooses plain search for it.
    unplanned = dataclasses.replace(cfg.hardware, costs={})

    def plain(name: str) -> Seq2SeqGenerator:
        config = dataclasses.replace(load_decoding(name), beam_size=k)
        return make_generator(config, target, None, tokenizer.vocab_info, cfg.hardware)

    baseline = MethodRun("beam", CountingGenerator(plain("beam")))
    lean = MethodRun("beam_lean", plain("beam_lean"))
    settings = [(g, w) for g in cfg.gammas for w in cfg.draft_widths]
    runs = [
        MethodRun(
            f"gamma={g} width={w}",
            make_generator(
                at_gamma(decoding, g, w),
                target,
                draft,
                tokenizer.vocab_info,
                unplanned,
            ),
        )
        for g, w in settings
    ]
    run_side_by_side(
        [baseline, lean, *runs], tokenizer, sources, cfg.task.src_lang,
        cfg.task.tgt_lang, batch_size=1, desc="τ grid",
    )  # fmt: skip
    cal = trusted(
        Calibration.of(points, k, baseline, lean, runs), hardware_dir(cfg) / f"{cfg.name}.yaml",
        load.cpus(), cfg.busy_cpus,
    )  # fmt: skip
    c = cal.costs
    rows = []
    for (gamma, width), run in zip(settings, runs, strict=True):
        s = run.stats
        shape = PassShape.of(s)
        accept_ms = 1000 * (s.seconds["accept"] + s.seconds["commit"]) / max(s.source_passes, 1)
        beside_ms = beside_calls_ms(c.target, c.draft, run.total_seconds, s)
        break_even = c.pass_ms(True, k, 1, shape) / c.plain_ms(k)
        rows.append(GridRow(
            gamma, width, shape, accept_ms, beside_ms, break_even, c.speedup(k, shape),
            lean.total_seconds / run.total_seconds, baseline.total_seconds / run.total_seconds,
        ))  # fmt: skip
    return cal, rows


CEILING_DEPTHS: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
"""γ of the trees priced with a perfect draft, each beam_size wide: all such a draft needs."""


def ceiling_table(
    costs: PlanCosts, k: int, fairseq2_step_ms: float, seen: tuple[str, PassShape]
) -> str:
    """A measured pass shape (`seen`: its name and shape) and trees whose every level holds
    the target's beam (a pass advances γ + 1 steps), priced at batch 1 as the planner
    prices them: the cost model's ceiling for exact speculation on this machine, and the τ
    each tree needs to break even with plain search."""
    rows = [seen]
    rows += [
        (f"γ {g}, width {k}, perfect draft", PassShape.perfect(DraftShape(beam_size=k, depth=g, width=k)))
        for g in CEILING_DEPTHS
    ]  # fmt: skip
    plain = costs.plain_ms(k)
    lines = [
        f"lean plain step {plain:.2f} ms, fairseq2's beam step {fairseq2_step_ms:.2f} ms, "
        f"{costs.accept_ms:.2f} ms per pass beside the calls",
        "",
        "| tree | verified tokens | draft calls | pass ms | τ | breaks even at τ | ms per step | vs lean plain | vs fairseq2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, shape in rows:
        ms = costs.pass_ms(True, k, 1, shape)
        lines.append(
            f"| {name} | {shape.slots:.1f} | {shape.draft_calls:.2f} | {ms:.1f} | {shape.tau:.2f} "
            f"| {ms / plain:.2f} | {ms / shape.tau:.2f} | {costs.speedup(k, shape):.2f}× "
            f"| {fairseq2_step_ms * shape.tau / ms:.2f}× |"
        )
    seen_ms = costs.pass_ms(True, k, 1, seen[1])
    even = _needed(seen_ms / plain, plain / seen_ms, "even with lean plain search", "breaks")
    faster = _needed(
        1.5 * seen_ms / fairseq2_step_ms, fairseq2_step_ms / seen_ms, "fairseq2's beam search"
    )
    lines += [
        "",
        f"At the measured tree shape a pass costs {seen_ms:.1f} ms: {even}, {faster}.",
    ]
    return "\n".join(lines)


def _needed(tau: float, at_one: float, against: str, verb: str = "gives 1.5×") -> str:
    """The τ a goal needs; a pass advances at least one step, so below 1 every τ meets it
    (`at_one`: the ratio one step a pass already gives)."""
    if tau > 1:
        return f"τ {tau:.2f} {verb} {against}"
    return f"τ 1 already gives {at_one:.2f}× {against.removeprefix('even with ')}"


def describe(cal: Calibration, hardware: HardwareConfig, beam_size: int) -> str:
    cost = cal.costs
    measured = {
        m: ", ".join(f"{t}: {ms:.2f}" for t, ms in points.items())
        for m, points in cal.calls.items()
    }
    verify = f"{cost.target.a:.2f} + {cost.target.b:.3f}·T"
    draft = f"{cost.draft.a:.2f} + {cost.draft.b:.3f}·T"
    return (
        f"cost model (threads={hardware.threads}; ms per call over T query slots):\n"
        f"  {f'verify (target, {hardware.target_precision})':<27}{verify:<18}measured T: ms = {measured['target']}\n"
        f"  {f'draft ({hardware.draft_dtype})':<27}{draft:<18}measured T: ms = {measured['draft']}\n"
        f"  {f'plain beam {beam_size} step':<27}{cal.fairseq2_step_ms:.2f} fairseq2, "
        f"{cost.plain_ms(beam_size):.2f} specbeam (lean), per target decoder call\n"
        f"  {'beside the calls':<27}{cost.accept_ms:.2f} per speculative pass (median of the grid)"
    )


def grid_table(rows: list[GridRow]) -> str:
    head = (
        "| γ | width | τ | breaks even at τ | slots/pass | draft calls/pass | accept ms/pass "
        "| beside ms/pass | predicted | measured | vs fairseq2 |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        p = r.shape
        lines.append(
            f"| {r.gamma} | {r.draft_width} | {p.tau:.2f} | {r.break_even_tau:.2f} | "
            f"{p.slots:.1f} | {p.draft_calls:.1f} | {r.accept_ms:.2f} | {r.beside_ms:.2f} | {r.predicted:.2f}× | {r.measured:.2f}× "
            f"| {r.vs_fairseq2:.2f}× |"
        )
    return "\n".join(lines)


def write_hardware(
    cfg: CalibrateConfig,
    decoding: str,
    k: int,
    best: GridRow,
    cal: Calibration,
    bounds: list[int] | None,
) -> Path:
    plan = cal.costs
    tuned = {**cfg.hardware.tuned.get(decoding, {}), "gamma": best.gamma,
             "draft_width": best.draft_width, "plan_tau": round(best.shape.tau, 2)}  # fmt: skip
    if bounds is not None:
        tuned["gamma_bounds"] = bounds
    costs = plan.to_stored()
    # What this run measured, beside what earlier calibrations of a config of the user's
    # measured (`hardware=my_pair method=relaxed name=my_pair` adds relaxed to spec_beam's);
    # a shipped config's other tuned settings were chosen for another pair, and their τ
    # measured there, so those decodings run with their decoding files' settings here.
    others = {} if shipped_hardware(cfg.hardware.name) else dict(cfg.hardware.tuned)
    others.pop(decoding, None)
    hw = dataclasses.replace(
        cfg.hardware, name=cfg.name, costs=costs, tuned={**others, decoding: tuned}
    )
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        f"# Written by `python -m specbeam.calibrate` on {socket.gethostname()}, {when}:",
        f"# model.target={cfg.model.target}, model.draft={cfg.model.draft} (costs are this "
        f"pair's), threads={hw.threads}, draft {hw.draft_dtype}, "
        f"{counted(cfg.sample, cfg.split + ' sentence')} at batch 1, medians of {cfg.repeats} timed calls.",
        f"# target call = {plan.target.a:.2f} + {plan.target.b:.3f}·T ms, draft call = "
        f"{plan.draft.a:.2f} + {plan.draft.b:.3f}·T ms, beam {k} step = {cal.fairseq2_step_ms:.2f} ms "
        f"(fairseq2), {plan.plain_ms(k):.2f} ms (specbeam's, lean); {plan.accept_ms:.2f} ms per "
        f"speculative pass beside its calls. `costs` are {decoding}'s.",
        f"# {decoding}: best γ={best.gamma}, draft_width={best.draft_width}: τ {best.shape.tau:.2f}, "
        f"over specbeam's plain search predicted {best.predicted:.2f}×, measured "
        f"{best.measured:.2f}× ({best.vs_fairseq2:.2f}× fairseq2's).",
        f"# tuned: {decoding}"
        + (f" (and, from hardware={cfg.hardware.name}, {', '.join(others)})" if others else "")
        + "; other decodings run with their decoding files' settings here.",
        *([f"# {cal.raised}."] if cal.raised else []),
    ]
    path = hardware_dir(cfg) / f"{cfg.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = OmegaConf.to_yaml(OmegaConf.structured(hw))
    path.write_text("\n".join(header) + "\n" + body)
    return path


def hardware_dir(cfg: CalibrateConfig) -> Path:
    return (
        user_config_dir() / "hardware" if cfg.hardware_dir is None else user_path(cfg.hardware_dir)
    )


def usage(path: Path) -> str:
    """How an app picks the written config: Hydra finds a group's configs in a directory
    named after the group, under a search-path entry (the per-user one is always on it)."""
    name = f"hardware={path.stem}"
    if path.parent == user_config_dir() / "hardware":
        return name
    if path.parent.name == "hardware":
        return f"{name} 'hydra.searchpath=[file://{path.parent.parent}]'"
    return f"{name}, after moving it to {user_config_dir() / 'hardware'}"


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def calibrate(cfg: CalibrateConfig) -> Path:
    if shipped_hardware(cfg.name):
        raise ValueError(
            f"name={cfg.name} is a shipped hardware config, which hardware={cfg.name} keeps "
            "meaning: choose another name"
        )
    cfg.hardware.apply()
    decoding = cfg.hardware.tune(load_decoding(cfg.method))
    if not decoding.speculative:
        raise ValueError(f"method={cfg.method} is not speculative: nothing to calibrate")
    bad = [w for w in cfg.draft_widths if w < decoding.beam_size]
    if bad:
        raise ValueError(
            f"draft_widths={bad} is invalid: must be ≥ beam_size ({decoding.beam_size})"
        )
    pair = cfg.hardware.place(open_pair(
        cfg.model, cfg.task.src_lang, cfg.task.tgt_lang, with_draft=True,
        draft_dtype=cfg.hardware.draft_torch_dtype,
    ))  # fmt: skip
    tokenizer, target, draft = pair.tokenizer, pair.target, pair.draft
    assert draft is not None
    sources = [p.source for p in cfg.task.split(cfg.split)[: cfg.sample]]
    with torch.inference_mode():
        cal, rows = run_grid(cfg, decoding, target, draft, tokenizer, sources)
    best = max(rows, key=lambda r: r.measured)
    for warning in (cal.raised, never_accepted(rows, best)):
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr)
    bounds = at_gamma(decoding, best.gamma, best.draft_width).gamma_bounds
    path = write_hardware(cfg, cfg.method, decoding.beam_size, best, cal, bounds)
    print(describe(cal, cfg.hardware, decoding.beam_size))
    print(f"\n{cfg.method} on {counted(len(sources), cfg.split + ' sentence')}, batch 1:\n")
    print(grid_table(rows))
    print(
        f"\nbest measured: gamma={best.gamma} draft_width={best.draft_width} "
        f"({best.measured:.2f}× specbeam's plain search, predicted {best.predicted:.2f}×; "
        f"{best.vs_fairseq2:.2f}× fairseq2's)"
    )
    seen = (f"γ {best.gamma}, width {best.draft_width}, measured", best.shape)
    k = decoding.beam_size
    print(
        "\nThe ceiling: a perfect draft's trees priced with these costs (predicted):\n\n"
        + ceiling_table(cal.costs, k, cal.fairseq2_step_ms, seen)
    )
    print(
        f"\nwrote {path} (use: {usage(path)})\n"
        f"peak resident memory: {peak_rss_mb():.0f} MiB (this process: the pair, its packed "
        "weights and every search above)"
    )
    return path


def never_accepted(rows: list[GridRow], best: GridRow) -> str | None:
    """A line where the target (almost) never took a drafted token, at any γ and width:
    the draft does not fit this target or is barely trained; the grid's numbers say so only
    to a reader who knows τ. It ends with what the planner does at batch 1 with the costs
    written and the `best` cell (tuned): a pass of one step can still cost less than a
    plain step."""
    tau = max(r.shape.tau for r in rows)
    if tau >= 1.05:
        return None
    planned = (
        "the planner will still speculate at batch 1, as a pass costs less than a plain step here"
        if best.predicted > 1
        else "the planner will run plain search"
    )
    return (
        f"the target took almost none of the draft's tokens (τ ≤ {tau:.2f} at every γ and "
        f"width): the draft is untrained or made for another target; {planned} (predicted "
        f"{best.predicted:.2f}× plain search at γ {best.gamma}, width {best.draft_width})"
    )


def shipped_hardware(name: str) -> bool:
    """Whether `hardware=name` is a config specbeam ships (tuned on the embedded pair)."""
    return (shipped("conf/hardware") / f"{name}.yaml").exists()


@hydra.main(version_base=None, config_path=str(SHIPPED / "conf"), config_name="calibrate")
def main(cfg: CalibrateConfig) -> None:
    run_app(calibrate, cfg)


def cli() -> None:
    """The command line (`app.before_hydra`)."""
    before_hydra(sys.argv[1:], "calibrate", __doc__)
    main()
