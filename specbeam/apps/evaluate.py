"""The comparison run: quality and speed of several decoding methods, side by side.

    python -m specbeam.evaluate                                    # beam vs spec_beam, test set
    python -m specbeam.evaluate methods=[beam,spec_beam,greedy,spec_greedy] limit=200
    python -m specbeam.evaluate 'methods=[beam,"spec_beam:gamma=6;draft_width=8"]'

Each method's exact match and speedup are against the first plain (non-speculative)
method of the same beam size, run in the same process on the same batches; `plain` is the
share of sentences a speculative method's planner decoded by plain search, and τ, accept
and passes/sent count the others' passes
(– where it made none: it ran plain on every sentence). Writes a Markdown
table (`results.md`, also printed), `results.json`, `results.csv` and PNG plots to the output
directory (Hydra's run directory unless `output_dir` is set).
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import matplotlib
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU, CHRF

from specbeam.apps.app import before_hydra, run_app
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.data.task import TaskConfig
from specbeam.integration.models import ModelPairConfig, open_pair
from specbeam.paths import SHIPPED, user_path

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@dataclass(kw_only=True)
class EvaluateConfig:
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    methods: list[str] = field(default_factory=lambda: ["beam", "spec_beam"])
    """Names of conf/decoding/*.yaml; the first is the reference."""
    split: str = "test"
    """The task's split the methods decode (`<split>.tsv` or plain files in task.data_dir)."""
    limit: int = 0
    """Evaluate the first n sentences of the split; 0 = all."""
    every: int = 1
    """Every n-th sentence of the split (before `limit`): all books in a fraction of the time."""
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    """Batch 1 gives latency; larger batches give throughput. Quality comes from the first."""
    output_dir: str | None = None
    """Where the results and plots are written (relative to the working directory); None:
    Hydra's run directory."""

    def check(self) -> None:
        """The settings only this app has, before any model is loaded or sentence decoded:
        a results directory that cannot be made would be found after the whole run."""
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError(
                f"methods={list(self.methods)} is invalid: name one or more decodings, each once"
            )
        if self.every < 1:
            raise ValueError(f"every={self.every} is invalid: must be ≥ 1")
        if self.limit < 0:
            raise ValueError(f"limit={self.limit} is invalid: must be ≥ 0 (0: all)")
        bad = [b for b in self.batch_sizes if b < 1]
        if not self.batch_sizes or bad:
            raise ValueError(f"batch_sizes={list(self.batch_sizes)} is invalid: each must be ≥ 1")
        if self.output_dir is not None:
            out = user_path(self.output_dir)
            if out.exists() and not out.is_dir():
                raise ValueError(f"output_dir={self.output_dir} is a file: give a directory")
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise ValueError(
                    f"cannot make output_dir={self.output_dir}: {error.strerror}"
                ) from None


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


def baseline_index(decodings: list[DecodingConfig], i: int) -> int:
    """A method is compared with the first plain method of its search (beam size, or
    sampling), else the first."""
    me = decodings[i]
    for j, d in enumerate(decodings):
        same = d.search == me.search and (d.search == "sample" or d.beam_size == me.beam_size)
        if not d.speculative and same:
            return j
    return 0


def summarise(
    runs: list[MethodRun], decodings: list[DecodingConfig], refs: list[str], batch_size: int, n: int
) -> list[dict]:
    rows = []
    for i, run in enumerate(runs):
        reference = runs[baseline_index(decodings, i)]
        # A speculative method whose planner ran every sentence plain made no passes: it is
        # 100% plain, and has no τ (a plain method's is 1).
        planned = decodings[i].speculative
        speculative = run.stats.target_passes > 0
        bleu, chrf = BLEU(), CHRF()
        bleu_score, chrf_score = (
            bleu.corpus_score(run.outputs, [refs]),
            chrf.corpus_score(run.outputs, [refs]),
        )
        seconds = sorted(run.seconds)
        rows.append({
            "method": run.name,
            "baseline": reference.name,
            "batch_size": batch_size,
            "bleu": bleu_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf": chrf_score.score,
            "chrf_signature": str(chrf.get_signature()),
            "exact_match": sum(a == b for a, b in zip(run.tokens, reference.tokens, strict=True)) / n,
            "seconds": run.total_seconds,
            "speedup": reference.total_seconds / run.total_seconds,
            "plain_share": run.stats.plain_sources / n if planned else None,
            "tau": run.stats.tau if speculative else None if planned else 1.0,
            "acceptance_rate": run.stats.acceptance_rate if speculative else None,
            "target_passes_per_sentence": run.stats.source_passes / n if speculative else None,
            "verified_slots_per_pass": run.stats.verified_slots / max(run.stats.target_passes, 1),
            "phase_seconds": dict(run.stats.seconds) if speculative else None,
            "latency_p50_ms": 1000 * statistics.median(seconds),
            "latency_p90_ms": 1000 * seconds[min(len(seconds) - 1, int(0.9 * len(seconds)))],
            "sentences_per_second": n / run.total_seconds,
            "target_tokens_per_second": run.generated_tokens / run.total_seconds,
            "peak_kv_cache_mb": run.peak_cache_bytes / 2**20,
        })  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| method | vs | batch | BLEU | chrF | exact | speedup | plain | τ | accept | passes/sent | p50 ms | p90 ms | sent/s | KV MB |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        acc = "–" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        plain = "–" if r["plain_share"] is None else f"{r['plain_share']:.0%}"
        tau = "–" if r["tau"] is None else f"{r['tau']:.2f}"
        passes = (
            "–"
            if r["target_passes_per_sentence"] is None
            else f"{r['target_passes_per_sentence']:.1f}"
        )
        lines.append(
            f"| {r['method']} | {r['baseline']} | {r['batch_size']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['exact_match']:.3f} | "
            f"{r['speedup']:.2f}× | {plain} | {tau} | {acc} | {passes} | {r['latency_p50_ms']:.0f} | "
            f"{r['latency_p90_ms']:.0f} | {r['sentences_per_second']:.2f} | {r['peak_kv_cache_mb']:.1f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> None:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    first = [r for r in rows if r["batch_size"] == rows[0]["batch_size"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    # Each bar against its own baseline (greedy against greedy): named under the bar.
    labels = [f"{r['method']}\nvs {r['baseline']}" for r in first]
    ax1.bar(labels, [r["speedup"] for r in first])
    ax1.set_ylabel(f"speedup over its baseline (batch {rows[0]['batch_size']})")
    # A method that ran plain on every sentence has no τ: no bar, and says so.
    taus = ax2.bar(
        [r["method"] for r in first], [r["tau"] or 0.0 for r in first], color="tab:orange"
    )
    ax2.bar_label(taus, ["all plain" if r["tau"] is None else "" for r in first])
    ax2.set_ylabel("τ (beam steps per target pass)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(out / "speedup_tau.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for method in methods:
        points = [r for r in rows if r["method"] == method]
        ax.plot(
            [r["batch_size"] for r in points],
            [r["sentences_per_second"] for r in points],
            "o-",
            label=method,
        )
    ax.set_xlabel("batch size")
    ax.set_ylabel("sentences / s")
    ax.set_xscale("log", base=2)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)


def evaluate(cfg: EvaluateConfig) -> None:
    cfg.check()
    pairs = cfg.task.split(cfg.split)[:: cfg.every][: cfg.limit or None]
    if not pairs:
        raise ValueError(f"split '{cfg.split}' in task.data_dir={cfg.task.data_dir} holds no pairs")
    out = (
        user_path(cfg.output_dir) if cfg.output_dir else Path(HydraConfig.get().runtime.output_dir)
    )
    cfg.hardware.apply()
    decodings = [cfg.hardware.tune(load_decoding(name)) for name in cfg.methods]
    pair = cfg.hardware.place(open_pair(
        cfg.model, cfg.task.src_lang, cfg.task.tgt_lang,
        with_draft=any(d.speculative for d in decodings), draft_dtype=cfg.hardware.draft_torch_dtype,
    ))  # fmt: skip
    tokenizer, target, draft = pair.tokenizer, pair.target, pair.draft
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    rows = []
    vocab = tokenizer.vocab_info
    for batch_size in cfg.batch_sizes:
        runs = [
            MethodRun(
                d.name,
                make_generator(d, target, draft, vocab, cfg.hardware),
            )
            for d in decodings
        ]
        run_side_by_side(
            runs, tokenizer, sources, cfg.task.src_lang, cfg.task.tgt_lang, batch_size=batch_size,
            desc=f"batch {batch_size}",
        )  # fmt: skip
        rows += summarise(runs, decodings, refs, batch_size, len(pairs))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(
            {"config": OmegaConf.to_container(OmegaConf.structured(cfg)), "rows": rows}, indent=1
        )
        + "\n"
    )
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out)
    table = (
        f"{markdown(rows)}\n\nBLEU: {rows[0]['bleu_signature']}\n"
        f"chrF: {rows[0]['chrf_signature']}\n"
    )
    (out / "results.md").write_text(table, encoding="utf-8")
    print(f"{table}results: {out}")


@hydra.main(version_base=None, config_path=str(SHIPPED / "conf"), config_name="evaluate")
def main(cfg: EvaluateConfig) -> None:
    run_app(evaluate, cfg)


def cli() -> None:
    """The command line (`app.before_hydra`)."""
    before_hydra(sys.argv[1:], "evaluate", __doc__)
    main()
