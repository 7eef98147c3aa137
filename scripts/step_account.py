"""Where a decoder step's time goes, part by part, against this machine's physical limit.

    .venv/bin/python scripts/step_account.py                       # embedded target, fp32
    .venv/bin/python scripts/step_account.py --dtype float32 int8  # a table per precision
    .venv/bin/python scripts/step_account.py --model dense_600m    # NLLB 600M, real vocabulary

Two kinds of call, each on the target (`--model`: the embedded `bible_es_en`, `tiny_random`,
or fairseq2's NLLB `dense_600m` architecture with its 256,206-token vocabulary and random
seeded weights, whose sources are random token ids):
- a plain beam step: `decoding=beam_lean`, k rows, batch 1;
- a verification pass: spec_beam's target call over T slots, with cpu.yaml's tuned γ and
  draft width held fixed (no planner, no adaptive γ), and its acceptance.

(a) The whole step: sentences decoded one at a time by the generator, its loop's time less
the draft's, per target call. Its parts, timed alone at the run's shapes:
(b) products: every linear of every layer and the output projection, resolved as the kernels
    resolve them for that row count (`onednn.resolve`, `resolve_group` for q/k/v), in
    sequence over the layers, so that weights stream from memory as in a call;
(c) attention: self over each hypothesis' prefix at the run's mean length, cross over the
    source, through the lean layers' kernel (`attention.attend`);
(d) log-softmax and the top 2k over the vocabulary, as compiled acceptance runs them, once
    per beam step (τ per pass);
(e) acceptance and the cache's commit: the generator's accept and commit phases less (d);
(f) everything else: (a) less the parts (the interpreter and op dispatch around them); of
    which inside the decoder call: its phase less (b) and (c).
Floors: the bytes a step streams (weights in their precision, the keys and values read) ÷
the memory read bandwidth measured here (`torch.sum` over `--bandwidth-mb`), and its FLOPs ÷
the measured peak of a 2048³ GEMM in the target's precision, on the run's threads.

Every repeat runs the searches, each part and both floors' probes in turn, so that machine
noise falls alike; tables give min and median ms. Writes step_account_<model>.md, .json and
.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.models.nllb import get_nllb_model_hub
from fairseq2.models.transformer import TransformerModel
from torch import Tensor
from tqdm import tqdm

from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator
from specbeam.apps.hardware import HardwareConfig, load_hardware
from specbeam.data.batches import pad
from specbeam.data.inference import encode_sources, target_prompt
from specbeam.integration.models import Draft, LoadedPair, ModelArch, build_model, open_pair
from specbeam.kernels import attention, native, onednn, quant
from specbeam.kernels.cpu import cpu_kind
from specbeam.kernels.runtime import Runtime
from specbeam.search.head import DraftHead, HeadArch
from specbeam.search.stats import SpeculativeGeneratorOutput

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NLLB_VOCAB = 256_206
BYTES = {"float32": 4, "bfloat16": 2, "int8": 1}
PARTS = ("products", "attention", "log-softmax + top-k", "acceptance, commit", "everything else")


@dataclass
class Setup:
    """A target and its draft on this machine's settings, and the sources to decode."""

    model: str
    precision: str
    hw: HardwareConfig
    target: TransformerModel
    draft: Draft
    vocab: VocabularyInfo
    sources: list[Tensor]
    prompt: Tensor
    gen_len: int | None  # at most this many tokens (None: the decoding files' limit)


def load(args: argparse.Namespace, dtype: str) -> Setup:
    """The target in `dtype` (and its draft) as the apps place them, on `--threads`."""
    hw = dataclasses.replace(load_hardware("cpu"), target_dtype=dtype, threads=args.threads)
    hw.apply()
    if args.model == "dense_600m":
        pair, vocab = random_nllb(), VocabularyInfo(NLLB_VOCAB, 1, 2, 3, 0)
        gen = torch.Generator().manual_seed(0)
        sources = [
            torch.cat([torch.randint(4, NLLB_VOCAB, (args.source_len - 1,), generator=gen),
                       torch.tensor([vocab.eos_idx])])
            for _ in range(args.sentences)
        ]  # fmt: skip
        prompt, gen_len = torch.tensor([vocab.eos_idx, NLLB_VOCAB - 1]), args.gen_len or 24
    else:
        from bench import load_config  # scripts/: the apps' configs, composed by Hydra

        cfg = load_config(args.model, "cpu")
        task = cfg.task
        pair = open_pair(cfg.model, task.src_lang, task.tgt_lang, with_draft=True,
                         draft_dtype=hw.draft_torch_dtype)  # fmt: skip
        verses = [p.source for p in task.split("test")[:: args.every][: args.sentences]]
        sources = encode_sources(pair.tokenizer, verses, task.src_lang)
        vocab, prompt = pair.tokenizer.vocab_info, target_prompt(pair.tokenizer, task.tgt_lang)
        gen_len = args.gen_len
    pair = hw.place(pair)
    assert pair.draft is not None
    return Setup(args.model, hw.target_precision, hw, pair.target, pair.draft, vocab, sources,
                 prompt, gen_len)  # fmt: skip


def random_nllb() -> LoadedPair:
    """fairseq2's `dense_600m` with the real vocabulary and a draft head, seeded weights."""
    config = get_nllb_model_hub().get_arch_config("dense_600m")
    torch.manual_seed(0)
    arch = ModelArch.of_nllb(dataclasses.replace(config, vocab_size=NLLB_VOCAB))
    target = build_model(arch).eval()
    return LoadedPair(None, target, DraftHead(target, HeadArch()).eval())  # type: ignore[arg-type]


def generators(setup: Setup) -> dict[str, Seq2SeqGenerator]:
    """The plain search and spec_beam with the tree cpu.yaml tunes, fixed (no planner, no
    adaptive γ), so that every pass verifies the same number of slots."""

    def decoding(name: str, **changes: object) -> DecodingConfig:
        config = dataclasses.replace(setup.hw.tune(load_decoding(name)), **changes)
        if setup.gen_len is not None:
            config.max_gen_len = [0.0, setup.gen_len]
        return config

    plain = decoding("beam_lean")
    spec = decoding("spec_beam", plan=False, gamma_bounds=None)
    t, d, v, hw = setup.target, setup.draft, setup.vocab, setup.hw
    return {
        "plain beam step": make_generator(plain, t, None, v, hw),
        "verification pass": make_generator(spec, t, d, v, hw),
    }


@dataclass
class Searched:
    """One run of a generator over the sources: its phases summed, and the calls' shape."""

    seconds: float = 0.0  # the loop's, less the draft's
    verify: float = 0.0
    beside: float = 0.0  # accept + commit
    draft: float = 0.0
    calls: int = 0  # target calls
    steps: int = 0  # beam steps
    slots: int = 0  # query slots the target calls computed
    prefix_sum: float = 0.0  # Σ over calls of the cached prefix's length

    @property
    def tau(self) -> float:
        return self.steps / self.calls

    def per_call_ms(self) -> dict[str, float]:
        return {name: 1000 * getattr(self, name) / self.calls
                for name in ("seconds", "verify", "beside", "draft")}  # fmt: skip


def search(gen: Seq2SeqGenerator, setup: Setup, k: int) -> Searched:
    """Decodes the sources one at a time. A plain call's stats count no passes: its steps
    come from fairseq2's counter (a step generates k elements, the first one)."""
    found = Searched()
    prompt, prompt_layout = pad([setup.prompt], 0)
    for source in setup.sources:
        src, layout = pad([source], 0)
        out = gen(src, layout, prompt, prompt_layout)
        assert isinstance(out, SpeculativeGeneratorOutput)
        s, phases = out.stats, out.stats.seconds
        if s.target_passes:
            calls, steps, slots = s.target_passes, s.steps, s.verified_slots
        else:
            calls = steps = (out.counters.num_generated_elements + k - 1) // k
            slots = k * (steps - 1) + len(setup.prompt)
        found.seconds += out.counters.generation_time - phases["draft"]
        found.verify += phases["verify"]
        found.beside += phases["accept"] + phases["commit"]
        found.draft += phases["draft"]
        found.calls += calls
        found.steps += steps
        found.slots += slots
        # Call j sees the prompt and about j·τ accepted steps.
        found.prefix_sum += calls * (len(setup.prompt) + (steps - steps / calls) / 2)
    return found


def timed(run: Callable[[], object], calls: int) -> float:
    """Milliseconds per call of `run`, over `calls` calls."""
    began = time.perf_counter()
    for _ in range(calls):
        run()
    return 1000 * (time.perf_counter() - began) / calls


@dataclass(frozen=True)
class Shape:
    """A call as the run made it: rows (query slots), the cached prefix per hypothesis, the
    source length, and beam steps per call (τ)."""

    rows: int
    k: int
    prefix: int
    source_len: int
    tau: float


@dataclass
class Part:
    """A part of a call, timed alone: what it streams and computes."""

    run: Callable[[], object]
    bytes: float = 0.0
    flops: float = 0.0


def products(target: TransformerModel, rows: int) -> Part:
    """Every linear of every decoder layer and the output projection over `rows` rows,
    resolved as the native layers resolve them (a quantized projection in its precision;
    MKL packs a weight for a row count after a few uses: resolved until settled), run in
    sequence."""
    for _ in range(onednn.PACK_AFTER + 1):
        found: list[onednn.Product] = []
        precisions: list[str] = []
        for layer in target.decoder.layers:
            attn, cross, ffn = layer.self_attn, layer.encoder_decoder_attn, layer.ffn
            qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
            group = onednn.resolve_projections(rows, torch.float32, qkv)
            singles = (attn.output_proj, cross.q_proj, cross.output_proj, ffn.inner_proj,
                       ffn.output_proj)  # fmt: skip
            each = [*(() if group is not None else qkv), *singles]
            found += [group] if group is not None else []
            found += [onednn.resolve_projection(rows, torch.float32, p) for p in each]
            precisions += [quant.precision_of(p) or "float32" for p in ([qkv[0]] if group is not None else []) + each]  # fmt: skip
        found.append(onednn.resolve_projection(rows, torch.float32, target.final_proj))
        precisions.append(quant.precision_of(target.final_proj) or "float32")
        if all(p.settled for p in found):
            break
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, rows, p.weight.size(1), generator=gen) for p in found]

    def run() -> None:
        for p, x in zip(found, inputs, strict=True):
            p(x)

    weights = [p.weight for p in found]
    return Part(
        run,
        bytes=sum(w.numel() * BYTES[p] for w, p in zip(weights, precisions, strict=True)),
        flops=sum(2.0 * w.numel() * rows for w in weights),
    )


def attentions(target: TransformerModel, shape: Shape) -> Part:
    """Each layer's self-attention (query i over hypothesis i mod k's prefix, interleaved
    position-major in the cache as `specbeam.search.cache` keeps it, its root and itself)
    and cross-attention over the source, through the lean layers' kernel."""
    gen = torch.Generator().manual_seed(0)
    rows, k, prefix = shape.rows, shape.k, shape.prefix
    keys = k * prefix + rows
    hyp = torch.arange(rows) % k
    column = torch.arange(keys)
    sees = column[None, : k * prefix] % k == hyp[:, None]
    new = (column[None, k * prefix :] == torch.arange(rows)[:, None]) | (
        column[None, k * prefix :] - k * prefix == hyp[:, None]
    )
    bias = torch.zeros(rows, keys).masked_fill_(~torch.cat([sees, new], 1), -torch.inf)
    calls: list[tuple[Tensor, Tensor, Tensor, Tensor | None]] = []
    model_dim = 0
    for layer in target.decoder.layers:
        heads, dim = layer.self_attn.num_heads, layer.self_attn.head_dim
        model_dim = heads * dim

        def randn(n: int, heads: int = heads, dim: int = dim) -> Tensor:
            return torch.randn(1, n, heads, dim, generator=gen)

        calls.append((randn(rows), randn(keys), randn(keys), bias[None, None]))
        calls.append((randn(rows), randn(shape.source_len), randn(shape.source_len), None))

    def run() -> None:
        for q, kk, v, b in calls:
            attention.attend(q, kk, v, b)

    layers = len(target.decoder.layers)
    seen = prefix + 2  # keys a self-attention query sees
    return Part(
        run,
        bytes=layers * 2 * model_dim * 4 * (k * prefix + rows + shape.source_len),
        flops=layers * 4.0 * rows * model_dim * (seen + shape.source_len),
    )


def vocabulary(vocab_size: int, shape: Shape, ext: object) -> Part:
    """One beam step's vocabulary-wide work, as compiled acceptance runs it: the k rows it
    reads, their log-softmax, and the top 2k of the k·V candidates (`csrc/top.cpp`)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(shape.rows, vocab_size, generator=gen)
    index, base = torch.arange(shape.k), torch.zeros(1, shape.k)

    def run() -> None:
        lprobs = torch.log_softmax(logits.index_select(0, index), -1)
        ext.top_candidates(base, lprobs.view(1, shape.k, vocab_size), 2 * shape.k)  # type: ignore[attr-defined]

    return Part(run)


def bandwidth_probe(megabytes: int) -> Callable[[], float]:
    """Bytes per second of one `torch.sum` over `megabytes` of fp32 (more than the caches):
    how fast the run's threads read memory."""
    x = torch.ones((megabytes << 20) // 4)

    def probe() -> float:
        began = time.perf_counter()
        x.sum()
        return x.numel() * 4 / (time.perf_counter() - began)

    return probe


def peak_probe(precision: str, size: int) -> Callable[[], float]:
    """FLOPs per second of one size³ GEMM in `precision` (int8: `torch._int_mm`)."""
    gen = torch.Generator().manual_seed(0)
    if precision == "int8":
        a, b = (torch.randint(-64, 64, (size, size), generator=gen, dtype=torch.int8) for _ in "ab")
        mm: Callable[[Tensor, Tensor], Tensor] = torch._int_mm
    else:
        dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
        a, b = (torch.randn(size, size, generator=gen).to(dtype) for _ in "ab")
        mm = torch.mm

    def probe() -> float:
        began = time.perf_counter()
        mm(a, b)
        return 2.0 * size**3 / (time.perf_counter() - began)

    return probe


@dataclass
class Account:
    """One call kind's samples (ms per call, one per repeat) and floors' probes."""

    model: str
    precision: str
    kind: str
    shape: Shape
    weight_bytes: float
    read_bytes: float  # weights and the keys and values attention reads
    flops: float
    samples: dict[str, list[float]] = field(default_factory=dict)
    bandwidth: float = 0.0  # bytes/s, the best probe
    peak: float = 0.0  # FLOP/s, the best probe

    def add(self, name: str, ms: float) -> None:
        self.samples.setdefault(name, []).append(ms)

    def column(self, stat: Callable[[Sequence[float]], float]) -> dict[str, float]:
        """The step and its parts under `stat` (min or median of the repeats): (d) is one
        beam step's vocabulary work τ times, (e) the accept and commit phases less it, and
        (f) the rest, so the parts add up to the step."""
        s = {name: stat(values) for name, values in self.samples.items()}
        vocab = s["vocabulary"] * self.shape.tau
        parts = {
            "products": s["products"],
            "attention": s["attention"],
            "log-softmax + top-k": vocab,
            "acceptance, commit": s["beside"] - vocab,
        }
        parts["everything else"] = s["step"] - sum(parts.values())
        return {
            "step": s["step"], **parts,
            "in the call beside (b), (c)": s["verify"] - s["products"] - s["attention"],
            "draft": s["draft"],
        }  # fmt: skip

    def floors_ms(self) -> dict[str, float]:
        return {
            "memory": 1000 * self.read_bytes / self.bandwidth,
            "compute": 1000 * self.flops / self.peak,
        }

    def title(self) -> str:
        s = self.shape
        return (
            f"{self.model}, {self.precision}: {self.kind}, {s.rows} rows (beam {s.k}), "
            f"prefix {s.prefix}, source {s.source_len} tokens, τ {s.tau:.2f}"
        )

    def markdown(self) -> str:
        low, mid = self.column(min), self.column(statistics.median)

        def row(label: str, name: str) -> str:
            shares = f"{low[name] / low['step']:.1%} / {mid[name] / mid['step']:.1%}"
            return f"| {label} | {low[name]:.3f} | {mid[name]:.3f} | {shares} |"

        def floor(label: str, ms: float) -> str:
            return f"| {label} | {ms:.3f} | {low['step'] / ms:.2f}× / {mid['step'] / ms:.2f}× |"

        floors = self.floors_ms()
        lines = [
            f"### {self.title()}\n",
            "| part | ms, min | ms, median | share of the step (min / median) |",
            "|---|---|---|---|",
            row("(a) whole step, as the generator runs it", "step"),
            *(row(f"({c}) {name}", name) for c, name in zip("bcdef", PARTS, strict=True)),
            row("of (f): inside the decoder call", "in the call beside (b), (c)"),
        ]
        if self.kind == "verification pass":
            lines.append(row("draft calls (not in the step)", "draft"))
        lines += [
            "",
            "| floor | ms | step ÷ floor (min / median) |",
            "|---|---|---|",
            floor(
                f"memory: {self.read_bytes / 1e6:.1f} MB read ({self.weight_bytes / 1e6:.1f} MB "
                f"weights) ÷ {self.bandwidth / 1e9:.1f} GB/s",
                floors["memory"],
            ),
            floor(
                f"compute: {self.flops / 1e9:.2f} GFLOP ÷ {self.peak / 1e9:.0f} GFLOP/s",
                floors["compute"],
            ),
        ]
        return "\n".join(lines)

    def record(self) -> dict[str, object]:
        return {
            "model": self.model, "precision": self.precision, "kind": self.kind,
            "shape": dataclasses.asdict(self.shape), "weight_bytes": self.weight_bytes,
            "read_bytes": self.read_bytes, "flops": self.flops,
            "bandwidth_bytes_per_s": self.bandwidth, "peak_flops_per_s": self.peak,
            "min_ms": self.column(min), "median_ms": self.column(statistics.median),
            "floors_ms": self.floors_ms(), "samples_ms": self.samples,
        }  # fmt: skip


def measure(setup: Setup, args: argparse.Namespace, ext: object) -> list[Account]:
    """Both call kinds' accounts; a first run of each search (a warm-up: weights are
    packed, buffers allocated) gives the shapes its parts are timed at."""
    k = load_decoding("beam_lean").beam_size
    gens = generators(setup)
    source_len = round(statistics.mean(len(s) for s in setup.sources))
    accounts, parts = [], {}
    for kind, gen in gens.items():
        first = search(gen, setup, k)
        plain = kind == "plain beam step"
        rows = k if plain else round(first.slots / first.calls)
        prefix = round(first.prefix_sum / first.calls)
        shape = Shape(rows, k, prefix, source_len, 1.0 if plain else first.tau)
        product, attend = products(setup.target, shape.rows), attentions(setup.target, shape)
        parts[kind] = {"products": product, "attention": attend,
                       "vocabulary": vocabulary(setup.vocab.size, shape, ext)}  # fmt: skip
        accounts.append(Account(
            setup.model, setup.precision, kind, shape, product.bytes,
            product.bytes + attend.bytes, product.flops + attend.flops,
        ))  # fmt: skip
    bandwidth = bandwidth_probe(args.bandwidth_mb)
    peak = peak_probe(setup.precision, args.gemm)
    for _ in tqdm(range(args.repeats), desc=f"{setup.model} {setup.precision}", unit="repeat",
                  file=sys.stderr):  # fmt: skip
        for account, gen in zip(accounts, gens.values(), strict=True):
            ms = search(gen, setup, k).per_call_ms()
            account.add("step", ms["seconds"])
            for name in ("verify", "beside", "draft"):
                account.add(name, ms[name])
        for account in accounts:
            for name, part in parts[account.kind].items():
                account.add(name, timed(part.run, args.calls))
        seen_bandwidth, seen_peak = bandwidth(), peak()
        for account in accounts:
            account.bandwidth = max(account.bandwidth, seen_bandwidth)
            account.peak = max(account.peak, seen_peak)
    return accounts


def plot(accounts: list[Account], path: Path) -> None:
    """Per account, its parts stacked (medians) beside its two floors."""
    fig, ax = plt.subplots(figsize=(2.2 + 2.2 * len(accounts), 5))
    colors = plt.get_cmap("tab10").colors
    for i, account in enumerate(accounts):
        mid, bottom = account.column(statistics.median), 0.0
        for j, name in enumerate(PARTS):
            value = max(mid[name], 0.0)
            ax.bar(3 * i, value, bottom=bottom, color=colors[j], label=name if i == 0 else None)
            bottom += value
        floors = account.floors_ms()
        ax.bar(3 * i + 1, floors["memory"], color="0.35",
               label="floor: bytes ÷ bandwidth" if i == 0 else None)  # fmt: skip
        ax.bar(3 * i + 1.8, floors["compute"], color="0.7",
               label="floor: FLOPs ÷ peak" if i == 0 else None)  # fmt: skip
    ax.set_xticks([3 * i + 0.9 for i in range(len(accounts))])
    ax.set_xticklabels([f"{a.precision}\n{a.kind}\n{a.shape.rows} rows" for a in accounts])
    ax.set_ylabel("ms per call (medians)")
    ax.set_title(f"{accounts[0].model} on {cpu_kind()}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bible_es_en",
                        help="bible_es_en (embedded), tiny_random or dense_600m")  # fmt: skip
    parser.add_argument("--dtype", nargs="+", default=["float32"],
                        choices=["float32", "int8", "bfloat16"])  # fmt: skip
    parser.add_argument("--sentences", type=int, default=4, help="decoded per repeat")
    parser.add_argument("--every", type=int, default=97, help="every n-th test verse")
    parser.add_argument("--source-len", type=int, default=24, help="dense_600m's sources")
    parser.add_argument("--gen-len", type=int, help="tokens at most (dense_600m: 24)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=10, help="calls per timing of a part")
    parser.add_argument("--threads", type=int, default=load_hardware("cpu").threads)
    parser.add_argument("--bandwidth-mb", type=int, default=1024)
    parser.add_argument("--gemm", type=int, default=2048, help="the peak probe's size")
    parser.add_argument("--out", type=Path, default=Path("bench_out"))
    args = parser.parse_args(argv)
    ext = native.build()
    if ext is None:
        raise SystemExit("error: the native extension could not be built (scripts/setup.sh)")
    accounts: list[Account] = []
    for dtype in args.dtype:
        setup = load(args, dtype)
        if setup.precision != dtype:
            print(f"{dtype}: this CPU runs it as {setup.precision}; skipped", file=sys.stderr)
            continue
        with torch.inference_mode(), Runtime(setup.hw.runtime_config()).active():
            accounts += measure(setup, args, ext)
        del setup
    head = (f"`lscpu`: {cpu_kind()}, {args.threads} threads; {args.model}, batch 1, "
            f"{args.sentences} sentences × {args.repeats} repeats, interleaved")  # fmt: skip
    text = head + "\n\n" + "\n\n".join(a.markdown() for a in accounts) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"step_account_{args.model}"
    stem.with_suffix(".md").write_text(text)
    record = {"cpu": cpu_kind(), "threads": args.threads, "args": vars(args) | {"out": str(args.out)},
              "accounts": [a.record() for a in accounts]}  # fmt: skip
    stem.with_suffix(".json").write_text(json.dumps(record, indent=1))
    if accounts:
        plot(accounts, stem.with_suffix(".png"))


if __name__ == "__main__":
    main()
