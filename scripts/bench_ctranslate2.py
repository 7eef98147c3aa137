"""specbeam against CTranslate2 at its best on the same target, each engine in a process of its own.

    .venv/bin/pip install -e '.[compare]'                  # CTranslate2 (PyPI)
    .venv/bin/python scripts/bench_ctranslate2.py            # every 14th test verse, 3 repeats
    .venv/bin/python scripts/bench_ctranslate2.py --quick    # 4 verses, 1 repeat (smoke test)
    .venv/bin/python scripts/bench_ctranslate2.py --search greedy    # spec_greedy vs greedy
    .venv/bin/python scripts/bench_ctranslate2.py --engines int8   # fairseq2 and every int8 row
    .venv/bin/python scripts/bench_ctranslate2.py --ct2-all  # every CTranslate2 variant timed

CTranslate2 is the fastest CPU engine for this model class, and it has no speculative
decoding: the bar specbeam's exact search must clear, at its best on this CPU. It picks its
GEMM backend by vendor (MKL on Intel, DNNL elsewhere) and AVX2 on an AVX-512 CPU; a careful
user tries the others. So every CTranslate2 compute type runs under each setting this CPU
has (`variants`: MKL with and without packed weights, DNNL, each at AVX2 and AVX-512),
first in a probe on `--probe` verses, one run each; the timed rows then take each compute
type's default and the settings fastest in the probe (`--ct2-all`: all of them). Its log
(`CT2_VERBOSE=1`) names the ISA and backends each row ran on, and a `CT2_*` variable it does
not read is an error, not a silent default.

A first process tokenizes the verses and converts the target once (seconds;
`~/.cache/specbeam/ct2/<hash of weights and epsilon>`) into CTranslate2's own Transformer
spec: the same weights, sinusoidal table, token ids and layer norm epsilon. Then every engine
runs in a fresh process: fairseq2's search (`--search beam`: beam 5; `greedy`), specbeam's
exact speculative one (`spec_beam`, `spec_greedy`) as configured (planner and all) on the
fp32 target and with its linear layers in bfloat16 and int8 where the CPU computes them
natively (`hardware.target_dtype`), and CTranslate2 at float32 and int8_float32, which
imports `ctranslate2` alone (no torch). `--engines` picks some by name or part of one;
fairseq2's search always runs, the reference. Each process reads the token ids from a file,
loads (not timed), makes one warm-up call per batching, then times its decode calls at batch
1, batch 16 and 1,024 padded source tokens (the torch engines in `translate`'s batches,
`specbeam.data.batches.token_batches`; CTranslate2 in its own, by `max_batch_size` tokens), with
OMP_NUM_THREADS and CTranslate2's intra_threads at `--threads` (inter_threads 1). The engines
run in a rotated order each repeat; rows give the minimum and the median, and speed against
fairseq2, against CTranslate2's fastest fp32 row and against its fastest row of any precision.

Beside the time, the CPU time every other process (all but the engine's and its descendants)
used during the timed calls, from each one's /proc/[pid]/stat (the scheduler's exact time
per process, its threads' and reaped children's included: what getrusage reads), and the
vCPUs' steal time (/proc/stat). Not /proc/stat's busy time minus the engine's own: busy
time there is sampled by the scheduler tick and idle time measured only inside the idle
loop, so a vCPU that halts and is woken very often (CTranslate2's int8 threads at
batch 1) spends time in neither, and busy time falls short of the engine's own CPU time.

Outputs are compared token by token with fairseq2's fp32 search (CTranslate2 ranks,
normalises and stops its beams its own way, so a few sentences may differ: counted, not
hidden); specbeam's bfloat16 and int8 rows are exact to its own plain search on that
quantized target, not to fp32. Writes ct2.md, ct2.json and ct2.png.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from specbeam.kernels.cpu import cpu_flags, cpu_kind

if TYPE_CHECKING:
    import torch
    from ctranslate2.specs import common_spec
    from fairseq2.models.transformer import TransformerModel

REPO_ROOT = Path(__file__).resolve().parents[1]  # scripts run from a checkout
CT2_TYPES = ("float32", "int8_float32")
"""CTranslate2's CPU compute types for this model (`int8` selects `int8_float32` on a CPU:
its log says so)."""
BATCHINGS = {"batch 1": ("examples", 1), "batch 16": ("examples", 16), "1,024 tokens": ("tokens", 1024)}  # fmt: skip
SEARCHES = {"beam": ("beam", "spec_beam"), "greedy": ("greedy", "spec_greedy")}
"""--search: fairseq2's decoding (the reference) and specbeam's exact speculative one."""
BASE = "fairseq2 beam"
SPEC = "specbeam spec_beam"
CT2 = "CTranslate2"
CT2_ENV = {"CT2_USE_MKL", "CT2_FORCE_CPU_ISA", "CT2_PACKED_GEMM", "CT2_VERBOSE"}
"""The CPU settings CTranslate2 reads from the environment (its docs/environment_variables.md;
the CUDA ones do nothing here). Any other `CT2_*` variable is an error: CTranslate2 would
ignore it silently."""
BACKENDS = {
    "MKL packed": {"CT2_USE_MKL": "1", "CT2_PACKED_GEMM": "1"},
    "MKL": {"CT2_USE_MKL": "1", "CT2_PACKED_GEMM": "0"},
    "DNNL": {"CT2_USE_MKL": "0"},
}
"""CTranslate2's x86 GEMM backends (`CT2_USE_MKL`; MKL's packed weights, `CT2_PACKED_GEMM`):
its default is MKL on an Intel CPU, DNNL elsewhere."""
SPEC_DTYPES = ("float32", "bfloat16", "int8")
"""The target precisions specbeam runs in (`hardware.target_dtype`); its rows but fp32's
are named `SPEC+<dtype>`."""

Job = dict[str, Any]
"""What the first process writes for the engines: token ids, batches, beam settings."""
Decode = Callable[[list[list[int]]], list[list[int]]]
"""Source token ids -> the best hypothesis' tokens (no EOS, no prompt)."""
Processes = dict[tuple[int, int], tuple[int, float, float]]
"""(pid, start time) -> (parent pid, own CPU seconds, reaped children's CPU seconds)."""


def token(i: int) -> str:
    """CTranslate2 names tokens; these names are the target's ids."""
    return ("<blank>", "<unk>", "<s>", "</s>")[i] if i < 4 else f"@{i}"


def _linear(spec: common_spec.LinearSpec, *linears: torch.nn.Module) -> None:
    """`linears` stacked (CTranslate2 fuses q/k/v and k/v into one product)."""
    spec.weight = np.concatenate([m.weight.detach().numpy() for m in linears])
    spec.bias = np.concatenate([m.bias.detach().numpy() for m in linears])


def _norm(spec: common_spec.LayerNormSpec, norm: torch.nn.Module) -> None:
    spec.gamma, spec.beta = norm.weight.detach().numpy(), norm.bias.detach().numpy()


def _frontend(spec: object, frontend: torch.nn.Module, max_len: int) -> None:
    import torch
    from fairseq2.nn import BatchLayout

    embed = frontend.embed.weight.detach()
    embeddings = spec.embeddings  # type: ignore[attr-defined]  # a list on the encoder side
    (embeddings[0] if isinstance(embeddings, list) else embeddings).weight = embed.numpy()
    spec.scale_embeddings = True  # type: ignore[attr-defined]  # fairseq2: × √d, as CTranslate2
    zeros = torch.zeros(1, max_len, embed.size(1))
    table = frontend.pos_encoder(zeros, BatchLayout.of(zeros))[0]
    spec.position_encodings.encodings = table.numpy()  # type: ignore[attr-defined]


def layer_norm_eps(model: TransformerModel) -> float:
    """The model's layer norm epsilon (one for all its norms, else an error)."""
    eps = {m.eps for m in model.modules() if type(m).__name__.endswith("LayerNorm")}
    if len(eps) != 1:
        raise SystemExit(f"error: the target's layer norms have epsilons {sorted(eps)}, not one")
    return float(eps.pop())


def convert(model: TransformerModel, out: Path, vocab_size: int) -> None:
    """The target as a CTranslate2 Transformer (pre-LN, ReLU, tied projection)."""
    import torch
    from ctranslate2.specs import common_spec, transformer_spec

    encoder, decoder = model.encoder.layers, model.decoder.layers
    heads = encoder[0].self_attn.num_heads
    spec = transformer_spec.TransformerSpec.from_config(
        (len(encoder), len(decoder)), heads, pre_norm=True, activation=common_spec.Activation.RELU
    )
    with torch.no_grad():
        max_len = model.max_target_seq_len
        _frontend(spec.encoder, model.encoder_frontend, max_len)
        _frontend(spec.decoder, model.decoder_frontend, max_len)
        for s, layer in zip(spec.encoder.layer, encoder, strict=True):
            a = layer.self_attn
            _linear(s.self_attention.linear[0], a.q_proj, a.k_proj, a.v_proj)
            _linear(s.self_attention.linear[1], a.output_proj)
            _norm(s.self_attention.layer_norm, layer.self_attn_layer_norm)
            _linear(s.ffn.linear_0, layer.ffn.inner_proj)
            _linear(s.ffn.linear_1, layer.ffn.output_proj)
            _norm(s.ffn.layer_norm, layer.ffn_layer_norm)
        for s, layer in zip(spec.decoder.layer, decoder, strict=True):
            a, c = layer.self_attn, layer.encoder_decoder_attn
            _linear(s.self_attention.linear[0], a.q_proj, a.k_proj, a.v_proj)
            _linear(s.self_attention.linear[1], a.output_proj)
            _norm(s.self_attention.layer_norm, layer.self_attn_layer_norm)
            _linear(s.attention.linear[0], c.q_proj)
            _linear(s.attention.linear[1], c.k_proj, c.v_proj)
            _linear(s.attention.linear[2], c.output_proj)
            _norm(s.attention.layer_norm, layer.encoder_decoder_attn_layer_norm)
            _linear(s.ffn.linear_0, layer.ffn.inner_proj)
            _linear(s.ffn.linear_1, layer.ffn.output_proj)
            _norm(s.ffn.layer_norm, layer.ffn_layer_norm)
        _norm(spec.encoder.layer_norm, model.encoder.layer_norm)
        _norm(spec.decoder.layer_norm, model.decoder.layer_norm)
        spec.decoder.projection.weight = model.decoder_frontend.embed.weight.detach().numpy()
    vocab = [token(i) for i in range(vocab_size)]
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    # fairseq2's prompt starts with EOS; the language token is a target prefix.
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "<unk>", "<s>", "</s>"
    spec.config.decoder_start_token = "</s>"
    spec.config.layer_norm_epsilon = layer_norm_eps(model)
    spec.validate()
    spec.optimize(quantization="float32")
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    spec.save(str(partial))
    partial.rename(out)


def prepare(job_path: Path, every: int, limit: int | None, search: str) -> None:
    """Tokenizes the verses, converts the target if not yet, and writes the job file."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from bench import Models, load_config

    from specbeam.apps.decoding import load_decoding
    from specbeam.data.batches import token_batches
    from specbeam.data.inference import encode_sources, target_prompt
    from specbeam.kernels import onednn

    cfg = load_config("bible_es_en", "cpu")
    models = Models.load(cfg)
    tokenizer, target = models.tokenizer, models.target
    eps = layer_norm_eps(target)
    key = hashlib.sha256(repr(eps).encode())  # the weights and the epsilon
    for tensor in target.state_dict().values():
        key.update(tensor.numpy().tobytes())
    where = Path.home() / ".cache/specbeam/ct2" / key.hexdigest()[:16]
    if not (where / "model.bin").exists():
        began = time.perf_counter()
        convert(target, where, tokenizer.vocab_info.size)
        print(f"converted the target to CTranslate2 in {time.perf_counter() - began:.1f} s: {where}")  # fmt: skip
    beam = cfg.hardware.tune(load_decoding(SEARCHES[search][0]))
    pairs = cfg.task.split("test")[::every][: limit or None]
    sources = [s.tolist() for s in encode_sources(tokenizer, [p.source for p in pairs], cfg.task.src_lang)]  # fmt: skip
    lengths = [len(s) for s in sources]
    order = sorted(range(len(sources)), key=lengths.__getitem__)
    batches = {
        name: [order[i : i + n] for i in range(0, len(order), n)]
        if kind == "examples"
        else token_batches(lengths, n)
        for name, (kind, n) in BATCHINGS.items()
    }
    job = {
        "sources": sources,
        "refs": [p.target for p in pairs],
        "prompt": target_prompt(tokenizer, cfg.task.tgt_lang).tolist(),
        "eos": int(tokenizer.vocab_info.eos_idx),
        "beam_size": beam.beam_size,
        "len_penalty": beam.len_penalty,
        "max_gen_len": list(beam.max_gen_len),
        "ct2_model": str(where),
        "native": [d for d in SPEC_DTYPES if onednn.native(d)],
        "avx512": "avx512f" in cpu_flags(),
        "search": search,
        "batches": batches,
    }
    job_path.write_text(json.dumps(job) + "\n")


def names(search: str) -> tuple[str, str]:
    """The reference's and specbeam's engine names for `--search`."""
    base, spec = SEARCHES[search]
    return f"fairseq2 {base}", f"specbeam {spec}"


def variants(avx512: bool) -> list[str]:
    """CTranslate2's settings worth a careful user's try on this CPU: each GEMM backend, and
    each ISA it dispatches to (it picks AVX2 on an AVX-512 CPU unless `CT2_FORCE_CPU_ISA`
    says otherwise). "default": no variable set, as it runs out of the box."""
    isas = ["AVX2", "AVX512"] if avx512 else ["AVX2"]
    return ["default", *(f"{b} {i}" for b in BACKENDS for i in isas)]


def ct2_env(engine: str) -> dict[str, str]:
    """The environment a CTranslate2 engine runs in: `CTranslate2 <type> <variant>`."""
    variant = engine.removeprefix(f"{CT2} ").partition(" ")[2]
    if variant == "default":
        return {}
    backend, _, isa = variant.rpartition(" ")
    return {**BACKENDS[backend], "CT2_FORCE_CPU_ISA": isa}


def check_ct2_env(environ: dict[str, str]) -> None:
    """A `CT2_*` variable CTranslate2 does not read would be silently ignored: refused."""
    unknown = sorted(k for k in environ if k.startswith("CT2_") and k not in CT2_ENV)
    if unknown:
        raise SystemExit(
            f"error: {', '.join(unknown)}: not a CTranslate2 CPU setting (it reads "
            f"{', '.join(sorted(CT2_ENV))}); unset it"
        )


def ct2_log(stderr: str) -> str:
    """What CTranslate2's log (`CT2_VERBOSE=1`) says it ran on: ISA, fp32 and int8 GEMM
    backends (`packed`: on weights packed once)."""
    found = {}
    for line in stderr.splitlines():
        for key, name in (("Selected ISA", "ISA"), ("SGEMM backend", "fp32"), ("GEMM_S8 backend", "int8")):  # fmt: skip
            if f"- {key}: " in line:
                value = line.split(f"- {key}: ", 1)[1]
                backend = value.split(" (")[0].strip()
                found[name] = backend + (" packed" if "packed: true" in value else "")
    return ", ".join(f"{name} {value}" for name, value in found.items())


def engines(native: list[str], ct2_variants: list[str], search: str = "beam") -> list[str]:
    """Every engine this machine runs, in the table's order (a reduced precision only where
    the CPU computes it natively, `onednn.native`: elsewhere specbeam runs it as fp32)."""
    base, spec = names(search)
    ours = [spec] + [f"{spec}+{d}" for d in SPEC_DTYPES[1:] if d in native]
    return [base, *ours, *(f"{CT2} {t} {v}" for t in CT2_TYPES for v in ct2_variants)]


def choose(available: list[str], wanted: list[str] | None) -> list[str]:
    """The engines `wanted` names (all if None), fairseq2's beam search always (the
    reference): an engine's whole name picks it alone, any other string every engine whose
    name contains it."""
    if not wanted:
        return available
    picked = [w for w in wanted if w in available]
    parts = [w for w in wanted if w not in available]
    unknown = [w for w in parts if not any(w in e for e in available)]
    if unknown:
        raise SystemExit(
            f"error: --engines {', '.join(unknown)}: no such engine here; "
            f"the engines are: {', '.join(available)}"
        )
    base = available[0]
    return [e for e in available if e == base or e in picked or any(w in e for w in parts)]


def torch_decoder(job: Job, engine: str, threads: int) -> Decode:
    """fairseq2's search or specbeam's speculative one (`+<dtype>`: the target's
    precision), loaded."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import torch
    from bench import Models, load_config
    from fairseq2.nn import BatchLayout

    from specbeam.apps.decoding import load_decoding

    cfg = load_config("bible_es_en", "cpu")
    cfg.hardware.threads = threads
    cfg.hardware.target_dtype = engine.partition("+")[2] or "float32"
    models = Models.load(cfg)
    base, spec = SEARCHES[job["search"]]
    method = base if engine.startswith("fairseq2") else spec
    generator = models.generator(cfg.hardware.tune(load_decoding(method)))
    prompt, eos = torch.tensor(job["prompt"]), job["eos"]
    # As a translate process after start-up (specbeam/startup.py), for both torch engines:
    # the run's collections skip the modules and models.
    gc.freeze()

    def run(seqs: list[list[int]]) -> list[list[int]]:
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in seqs], batch_first=True)
        prompts = prompt.expand(len(seqs), -1)
        out = generator(src, BatchLayout.of(src, [len(s) for s in seqs]), prompts, BatchLayout.of(prompts))  # fmt: skip
        return [[t for t in hyps[0].seq.tolist() if t != eos] for hyps in out.hypotheses]

    return run


def ct2_decoder(job: Job, compute_type: str, threads: int, tokens: int | None) -> Decode:
    """CTranslate2 at `compute_type`; `tokens`: its own batching by padded tokens."""
    import ctranslate2

    translator = ctranslate2.Translator(
        job["ct2_model"], device="cpu", compute_type=compute_type, intra_threads=threads,
        inter_threads=1,
    )  # fmt: skip
    (len_a, len_b), lang = job["max_gen_len"], token(job["prompt"][-1])
    batching = {"max_batch_size": tokens, "batch_type": "tokens"} if tokens else {}

    def run(seqs: list[list[int]]) -> list[list[int]]:
        res = translator.translate_batch(
            [[token(t) for t in s] for s in seqs], target_prefix=[[lang]] * len(seqs),
            beam_size=job["beam_size"], length_penalty=job["len_penalty"],
            max_decoding_length=int(len_a * max(len(s) for s in seqs) + len_b), **batching,
        )  # fmt: skip
        # Its hypotheses repeat the prefix (the language token).
        return [[int(t[1:]) for t in r.hypotheses[0] if t.startswith("@")][1:] for r in res]

    return run


def processes() -> Processes:
    """Every process now, from /proc/[pid]/stat: the kernel's per-task CPU time (what
    getrusage reads), the threads' and reaped children's included, whole clock ticks."""
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        f = text[text.rindex(")") + 2 :].split()  # from field 3 on: the name may hold spaces
        own, reaped = int(f[11]) + int(f[12]), int(f[13]) + int(f[14])
        found[int(name), int(f[19])] = (int(f[1]), own / tick, reaped / tick)
    return found


def descendants(procs: Processes, pid: int) -> set[int]:
    """`pid` and every process below it."""
    children = defaultdict(list)
    for (child, _), (parent, _, _) in procs.items():
        children[parent].append(child)
    found, todo = set(), [pid]
    while todo:
        found.add(p := todo.pop())
        todo += children[p]
    return found


def others_cpu(before: Processes, after: Processes, pid: int) -> float:
    """CPU seconds every process but `pid` and its descendants used between two snapshots:
    each one's own time, and that of its children that ended and were reaped meanwhile
    less what they had used before. Never negative: a process that ended unreaped by one in
    `after` (a kernel thread) takes its last moments with it."""
    ours = descendants(before, pid) | descendants(after, pid)
    ended: dict[int, float] = defaultdict(float)  # parent pid -> its ended children's time before
    for key, (parent, own, reaped) in before.items():
        if key not in after:
            ended[parent] += own + reaped
    total = 0.0
    for key, (_, own, reaped) in after.items():
        if key[0] not in ours:
            _, own0, reaped0 = before.get(key, (0, 0.0, 0.0))
            total += own - own0 + max(0.0, reaped - reaped0 - ended[key[0]])
    return total


def steal_seconds() -> float:
    """Time the hypervisor kept this machine's vCPUs from running (/proc/stat)."""
    steal = Path("/proc/stat").read_text().split("\n", 1)[0].split()[8]
    return int(steal) / os.sysconf("SC_CLK_TCK")


def work(job_path: Path, engine: str, threads: int, out: Path) -> None:
    """One engine over every batching: one warm-up call, then the timed calls."""
    job = json.loads(job_path.read_text())
    sources, results = job["sources"], {}
    ct2 = engine.split()[1] if engine.startswith(CT2) else None
    decode = None if ct2 else torch_decoder(job, engine, threads)
    for name, batches in job["batches"].items():
        if ct2:  # its own batching by tokens: every sentence in one call
            kind, n = BATCHINGS[name]
            decode = ct2_decoder(job, ct2, threads, n if kind == "tokens" else None)
            if kind == "tokens":
                batches = [[i for batch in batches for i in batch]]
        assert decode is not None
        decode([sources[i] for i in job["batches"][name][0]])
        seconds = others = steal = 0.0
        tokens: dict[int, list[int]] = {}
        for batch in batches:
            procs, stolen, began = processes(), steal_seconds(), time.perf_counter()
            hyps = decode([sources[i] for i in batch])
            seconds += time.perf_counter() - began
            steal += steal_seconds() - stolen
            others += others_cpu(procs, processes(), os.getpid())
            tokens.update(zip(batch, hyps, strict=True))
        results[name] = {
            "seconds": seconds, "others_cpu": others, "steal": steal,
            "tokens": [tokens[i] for i in range(len(sources))],
        }  # fmt: skip
    out.write_text(json.dumps(results) + "\n")


def texts(job_path: Path, runs_path: Path) -> None:
    """Detokenizes the engines' outputs (a list of token lists per run) in place."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import torch
    from bench import load_config

    cfg = load_config("bible_es_en", "cpu")
    decode = cfg.model.load_tokenizer().create_decoder(skip_special_tokens=True)
    runs = json.loads(runs_path.read_text())
    runs_path.write_text(json.dumps([[str(decode(torch.tensor(t))) for t in run] for run in runs]))


def spawn(step: list[str], threads: int, env: dict[str, str] | None = None) -> str:
    """This script's `step` in a fresh process, on `threads` OpenMP threads, with `env`
    added; CTranslate2's log, where `env` asks for it, is returned (its other stderr is
    passed on)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})}
    cmd = [sys.executable, __file__, *step]
    if "CT2_VERBOSE" not in env:
        subprocess.run(cmd, env=env, check=True)
        return ""
    done = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True)
    other = [line for line in done.stderr.splitlines() if "[ctranslate2]" not in line]
    if other:
        print("\n".join(other), file=sys.stderr)
    done.check_returncode()
    return done.stderr


def run_engine(job_path: Path, engine: str, threads: int, out: Path) -> dict:
    """One engine's timed calls in a fresh process; a CTranslate2 engine's result names
    the ISA and GEMM backends its log says it ran on."""
    env = {**ct2_env(engine), "CT2_VERBOSE": "1"} if engine.startswith(CT2) else None
    log = spawn(["--step", "work", str(job_path), engine, str(threads), str(out)], threads, env)
    result = json.loads(out.read_text())
    if log:
        result["backend"] = ct2_log(log)
    return result


def probe(job: Job, chosen: list[str], tmp: Path, threads: int, sentences: int) -> dict:
    """Every CTranslate2 variant chosen, once on `sentences` verses spread over the lengths,
    one at a time and all in one call: {engine: {batching: seconds, "backend": …}}."""
    picked = job["sources"][:: max(1, len(job["sources"]) // sentences)][:sentences]
    n = len(picked)
    small = {**job, "sources": picked, "batches": {"batch 1": [[i] for i in range(n)], "1,024 tokens": [list(range(n))]}}  # fmt: skip
    small_path = tmp / "probe.json"
    small_path.write_text(json.dumps(small) + "\n")
    found = {}
    for engine in tqdm([e for e in chosen if e.startswith(CT2)], desc="probing CTranslate2's settings"):  # fmt: skip
        result = run_engine(small_path, engine, threads, tmp / "run.json")
        found[engine] = {b: result[b]["seconds"] for b in small["batches"]}
        found[engine]["backend"] = result["backend"]
    return found


def best_variants(chosen: list[str], probed: dict) -> list[str]:
    """`chosen` with, of each CTranslate2 compute type, its default and the variants that
    were fastest in the probe at some batching; a variant its log says ran as the default
    did is the default (timed once)."""
    keep = set()
    for ct2_type in CT2_TYPES:
        mine = [e for e in probed if e.split()[1] == ct2_type]
        default = next((e for e in mine if e.endswith(" default")), None)
        keep.update([default] if default else [])
        for b in ("batch 1", "1,024 tokens"):
            if mine:
                best = min(mine, key=lambda e: probed[e][b])
                same = default and probed[best]["backend"] == probed[default]["backend"]
                keep.add(default if same else best)
    return [e for e in chosen if not e.startswith(CT2) or e in keep]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=14, help="every n-th test verse")
    parser.add_argument("--limit", type=int, help="at most n verses")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every engine")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="4 verses, 1 repeat")
    parser.add_argument("--search", choices=sorted(SEARCHES), default="beam")
    parser.add_argument(
        "--engines", nargs="+", metavar="NAME",
        help="engines by name or part of one (default: all); fairseq2's search always runs",
    )  # fmt: skip
    parser.add_argument(
        "--ct2-all", action="store_true",
        help="time every CTranslate2 variant (default: probe them all, time each compute "
        "type's default and its fastest)",
    )  # fmt: skip
    parser.add_argument("--probe", type=int, default=16, help="verses of the probe")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench_out")
    parser.add_argument("--step", nargs="+", help=argparse.SUPPRESS)  # the child processes'
    args = parser.parse_args()
    if args.step:
        kind, *rest = args.step
        if kind == "prepare":
            prepare(Path(rest[0]), int(rest[1]), int(rest[2]) or None, rest[3])
        elif kind == "work":
            work(Path(rest[0]), rest[1], int(rest[2]), Path(rest[3]))
        else:
            texts(Path(rest[0]), Path(rest[1]))
        return
    check_ct2_env(dict(os.environ))
    if args.quick:
        args.limit, args.repeats = 4, 1
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise SystemExit("CTranslate2 is not installed: .venv/bin/pip install -e '.[compare]'") from None  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        job_path = Path(tmp) / "job.json"
        spawn(["--step", "prepare", str(job_path), str(args.every), str(args.limit or 0), args.search], args.threads)  # fmt: skip
        job = json.loads(job_path.read_text())
        chosen = choose(engines(job["native"], variants(job["avx512"]), args.search), args.engines)  # fmt: skip
        probed = {} if args.ct2_all else probe(job, chosen, Path(tmp), args.threads, args.probe)
        if probed:
            chosen = best_variants(chosen, probed)
        runs: dict[str, list[dict]] = {e: [] for e in chosen}
        for r in range(args.repeats):
            for engine in chosen[r % len(chosen) :] + chosen[: r % len(chosen)]:
                print(f"repeat {r + 1}/{args.repeats}: {engine}", file=sys.stderr)
                runs[engine].append(run_engine(job_path, engine, args.threads, Path(tmp) / "run.json"))  # fmt: skip
        # Outputs are deterministic: each engine's last run, detokenized in one process.
        keys = [(e, b) for e in chosen for b in BATCHINGS]
        text_path = Path(tmp) / "texts.json"
        text_path.write_text(json.dumps([runs[e][-1][b]["tokens"] for e, b in keys]))
        spawn(["--step", "texts", str(job_path), str(text_path)], args.threads)
        text = dict(zip(keys, json.loads(text_path.read_text()), strict=True))
    write(table(job, runs, text), probed, job, args, args.out)


def table(job: Job, runs: dict[str, list[dict]], text: dict[tuple[str, str], list[str]]) -> dict:
    """Per batching and engine: min and median seconds, other processes' CPU and steal,
    agreement, BLEU, and speed against fairseq2 and against CTranslate2 at its best (its
    fastest fp32 row, and its fastest row of any precision)."""
    from sacrebleu.metrics import BLEU

    metric, results = BLEU(), {}
    base_name = next(iter(runs))
    for b in BATCHINGS:
        base = runs[base_name][-1][b]["tokens"]
        fastest = {e: min(r[b]["seconds"] for r in rs) for e, rs in runs.items()}
        ct2 = {e: t for e, t in fastest.items() if e.startswith(CT2)}
        ct2_fp32 = min((t for e, t in ct2.items() if e.split()[1] == "float32"), default=None)
        results[b] = {}
        for engine, rs in runs.items():
            seconds = [r[b]["seconds"] for r in rs]
            results[b][engine] = {
                "min_seconds": min(seconds),
                "median_seconds": statistics.median(seconds),
                "others_cpu_seconds": statistics.median(r[b]["others_cpu"] for r in rs),
                "steal_seconds": statistics.median(r[b]["steal"] for r in rs),
                "speedup_vs_fairseq2": fastest[base_name] / min(seconds),
                "speedup_vs_ct2_fp32": ct2_fp32 / min(seconds) if ct2_fp32 else None,
                "speedup_vs_ct2_fastest": min(ct2.values()) / min(seconds) if ct2 else None,
                "backend": rs[-1].get("backend", ""),
                "identical_to_fairseq2": sum(
                    a == c for a, c in zip(rs[-1][b]["tokens"], base, strict=True)
                ),  # fmt: skip
                "bleu": round(metric.corpus_score(text[engine, b], [job["refs"]]).score, 2),
            }
    return {"results": results, "bleu_signature": str(metric.get_signature())}


def probe_lines(probed: dict, n: int) -> list[str]:
    """The probe's table: every CTranslate2 variant, seconds one at a time and in one call."""
    if not probed:
        return []
    lines = [
        f"CTranslate2's settings probed on {n} verses (one run each; the timed rows below "
        "take each compute type's default and its fastest here):", "",
        "| engine | ran on (its log) | batch 1 s | 1,024 tokens s |", "|---|---|---|---|",
    ]  # fmt: skip
    for engine, r in probed.items():
        lines.append(f"| {engine} | {r['backend']} | {r['batch 1']:.2f} | {r['1,024 tokens']:.2f} |")  # fmt: skip
    return [*lines, ""]


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}×"


def write(summary: dict, probed: dict, job: Job, args: argparse.Namespace, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, n = summary["results"], len(job["sources"])
    steal = any(round(r["steal_seconds"], 2) for rows in results.values() for r in rows.values())
    search = "Beam 5" if job["search"] == "beam" else "Greedy search"
    head = (
        f"{search} on {n} test verses, {args.threads} threads, {cpu_kind()}; each engine in a "
        f"fresh process, {args.repeats} repeat(s) in rotated order; speed: the other engine's "
        f"minimum over this one's (BLEU: {summary['bleu_signature']}). Other CPU: seconds every "
        "other process used during the timed calls (median; /proc/[pid]/stat)"
        + (", steal: seconds the host kept this machine's vCPUs waiting (median)" * steal)
        + ". `+bfloat16`, `+int8`: specbeam with the target's linear layers in that "
        "precision, exact to specbeam's own plain search on that quantized target, not "
        "to fp32: their 'identical to fairseq2' counts what the precision changes. "
        "CTranslate2 rows: compute type and settings (`default`: no CT2_* variable; "
        "`DNNL AVX512`: CT2_USE_MKL=0 CT2_FORCE_CPU_ISA=AVX512; `MKL`: CT2_USE_MKL=1 "
        "CT2_PACKED_GEMM=0; `MKL packed`: CT2_PACKED_GEMM=1), and what its log says it ran on."
    )
    cells = ["batching", "engine", "ran on", "min s", "median s", "other CPU s", *["steal s"] * steal]  # fmt: skip
    cells += ["vs fairseq2", "vs CT2's best fp32", "vs CT2's fastest", "identical to fairseq2", "BLEU"]  # fmt: skip
    lines = [head, "", *probe_lines(probed, min(args.probe, n)), "| " + " | ".join(cells) + " |", "|---" * len(cells) + "|"]  # fmt: skip
    for b, rows in results.items():
        for name, r in rows.items():
            row = [b, name, r["backend"], *(f"{r[k]:.2f}" for k in ("min_seconds", "median_seconds", "others_cpu_seconds"))]  # fmt: skip
            row += [f"{r['steal_seconds']:.2f}"] * steal
            row += [_ratio(r[k]) for k in ("speedup_vs_fairseq2", "speedup_vs_ct2_fp32", "speedup_vs_ct2_fastest")]  # fmt: skip
            row += [f"{r['identical_to_fairseq2']}/{n}", f"{r['bleu']:.2f}"]
            lines.append("| " + " | ".join(row) + " |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "ct2.md").write_text("\n".join(lines) + "\n")
    meta = {"sentences": n, "threads": args.threads, "repeats": args.repeats, "cpu": cpu_kind(), "search": job["search"]}  # fmt: skip
    (out / "ct2.json").write_text(json.dumps({**summary, "probe": probed, **meta}, indent=1) + "\n")
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(8, 4.4))
    names = list(next(iter(results.values())))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + j * width for i in range(len(results))]
        ys = [rows[name]["speedup_vs_fairseq2"] for rows in results.values()]
        ax.bar(xs, ys, width, label=name)
        for x, y in zip(xs, ys, strict=True):
            ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(results))], list(results))
    ax.set_ylabel(f"speed vs fairseq2's {job['search']} search")
    ax.set_title(f"{search}, {n} test verses, {args.threads} threads, {meta['cpu']}")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    fig.savefig(out / "ct2.png", dpi=120)


if __name__ == "__main__":
    main()
