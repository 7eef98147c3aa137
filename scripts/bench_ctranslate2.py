"""specbeam against CTranslate2 on the same target: beam 5, side by side in one run.

    .venv/bin/pip install -e '.[compare]'                  # CTranslate2 (PyPI)
    .venv/bin/python scripts/bench_ctranslate2.py            # every 14th test verse
    .venv/bin/python scripts/bench_ctranslate2.py --every 1 --batch-sizes 1

CTranslate2 is the fastest CPU engine for this model class, and it has no speculative
decoding: the bar specbeam's exact beam search must clear. The target is converted once
(seconds; `~/.cache/specbeam/ct2/<hash of weights and epsilon>`), fp32, into CTranslate2's
own Transformer spec: the same weights, sinusoidal table, token ids and layer norm epsilon.
Every batch is decoded by fairseq2's beam search, by specbeam's `spec_beam` as configured (planner and all), and by
CTranslate2, in turn, on the same threads; the output is compared token by token with
fairseq2's (CTranslate2 ranks, normalises and stops its beams its own way, so a few
sentences may differ: counted, not hidden). Writes ct2.md, ct2.json and ct2.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import torch
from fairseq2.generation import Seq2SeqGenerator
from fairseq2.models.transformer import TransformerModel
from fairseq2.nn import BatchLayout
from sacrebleu.metrics import BLEU
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import Models, load_config  # noqa: E402

from specbeam.apps.decoding import load_decoding  # noqa: E402
from specbeam.apps.inference import encode_sources, target_prompt  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]  # scripts run from a checkout

try:
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError:
    raise SystemExit(
        "CTranslate2 is not installed: .venv/bin/pip install -e '.[compare]'"
    ) from None


Decode = Callable[[list[torch.Tensor]], list[list[int]]]
"""A batch of source token ids -> the best hypothesis' tokens (no EOS, no prompt)."""


def token(i: int) -> str:
    """CTranslate2 names tokens; these names are the target's ids."""
    return ("<blank>", "<unk>", "<s>", "</s>")[i] if i < 4 else f"@{i}"


def _linear(spec: common_spec.LinearSpec, *linears: torch.nn.Module) -> None:
    """`linears` stacked (CTranslate2 fuses q/k/v and k/v into one product)."""
    spec.weight = torch.cat([m.weight.detach() for m in linears]).numpy()
    spec.bias = torch.cat([m.bias.detach() for m in linears]).numpy()


def _norm(spec: common_spec.LayerNormSpec, norm: torch.nn.Module) -> None:
    spec.gamma, spec.beta = norm.weight.detach().numpy(), norm.bias.detach().numpy()


def _frontend(spec: object, frontend: torch.nn.Module, max_len: int) -> None:
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


@dataclass
class Run:
    decode: Decode
    seconds: list[float] = field(default_factory=list)
    tokens: dict[int, list[int]] = field(default_factory=dict)  # best hypothesis, no EOS

    def take(self, batch: list[int], sources: list[torch.Tensor]) -> None:
        """Decodes sources `batch` (indices), timed."""
        began = time.perf_counter()
        tokens = self.decode([sources[i] for i in batch])
        self.seconds.append(time.perf_counter() - began)
        self.tokens.update(zip(batch, tokens, strict=True))

    @property
    def total(self) -> float:
        return sum(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=14, help="every n-th test verse")
    parser.add_argument("--limit", type=int, help="at most n verses")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench_out")
    parser.add_argument(
        "--interleave", action="store_true",
        help="run the engines batch by batch in turn (default: one engine over all batches, "
        "then the next; CTranslate2's calls between specbeam's slow specbeam down)",
    )  # fmt: skip
    args = parser.parse_args()

    cfg = load_config("bible_es_en", "cpu")
    models = Models.load(cfg)
    tokenizer, target = models.tokenizer, models.target
    key = hashlib.sha256(repr(layer_norm_eps(target)).encode())  # the weights and the epsilon
    for tensor in target.state_dict().values():
        key.update(tensor.numpy().tobytes())
    where = Path.home() / ".cache/specbeam/ct2" / key.hexdigest()[:16]
    if not (where / "model.bin").exists():
        began = time.perf_counter()
        convert(target, where, tokenizer.vocab_info.size)
        print(
            f"converted the target to CTranslate2 in {time.perf_counter() - began:.1f} s: {where}"
        )
    threads = torch.get_num_threads()
    translator = ctranslate2.Translator(
        str(where), device="cpu", compute_type="float32", intra_threads=threads, inter_threads=1
    )
    beam_cfg = cfg.hardware.tune(load_decoding("beam"))
    spec_cfg = cfg.hardware.tune(load_decoding("spec_beam"))
    k, (len_a, len_b) = beam_cfg.beam_size, beam_cfg.max_gen_len

    pairs = cfg.task.split("test")[:: args.every][: args.limit or None]
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    src_tokens = encode_sources(tokenizer, sources, cfg.task.src_lang)
    prompt = target_prompt(tokenizer, cfg.task.tgt_lang)  # (EOS, language)
    eos = int(tokenizer.vocab_info.eos_idx)
    decode = tokenizer.create_decoder(skip_special_tokens=True)
    order = sorted(range(len(sources)), key=lambda i: len(src_tokens[i]))
    results: dict[int, dict] = {}
    metric = BLEU()

    def torch_method(gen: Seq2SeqGenerator) -> Decode:
        def run(seqs: list[torch.Tensor]) -> list[list[int]]:
            src = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
            prompts = prompt.expand(len(seqs), -1)
            out = gen(src, BatchLayout.of(src, [len(s) for s in seqs]), prompts, BatchLayout.of(prompts))  # fmt: skip
            return [[t for t in hyps[0].seq.tolist() if t != eos] for hyps in out.hypotheses]

        return run

    def ct2_method(seqs: list[torch.Tensor]) -> list[list[int]]:
        res = translator.translate_batch(
            [[token(t) for t in s.tolist()] for s in seqs],
            target_prefix=[[token(int(prompt[-1]))]] * len(seqs), beam_size=k,
            max_decoding_length=int(len_a * max(len(s) for s in seqs) + len_b),
            length_penalty=beam_cfg.len_penalty,
        )  # fmt: skip
        # Its hypotheses repeat the prefix (the language token).
        return [[int(t[1:]) for t in r.hypotheses[0] if t.startswith("@")][1:] for r in res]

    for size in args.batch_sizes:
        runs = {
            "fairseq2 beam": Run(torch_method(models.generator(beam_cfg))),
            "specbeam spec_beam": Run(torch_method(models.generator(spec_cfg))),
            "CTranslate2 beam": Run(ct2_method),
        }
        batches = [order[i : i + size] for i in range(0, len(order), size)]

        if args.interleave:
            for batch in tqdm(batches, desc=f"batch {size}", unit="batch"):
                for run in runs.values():
                    run.take(batch, src_tokens)
        else:  # each engine over all batches, then the next: as separate processes run
            for name, run in runs.items():
                for batch in tqdm(batches, desc=f"batch {size}, {name}", unit="batch"):
                    run.take(batch, src_tokens)
        base = runs["fairseq2 beam"]
        rows = {}
        for name, run in runs.items():
            text = [decode(torch.tensor(run.tokens[i])) for i in range(len(sources))]
            same = sum(run.tokens[i] == base.tokens[i] for i in range(len(sources)))
            bleu = metric.corpus_score(text, [refs])
            rows[name] = {
                "seconds": run.total,
                "speedup_vs_fairseq2": base.total / run.total,
                "identical_to_fairseq2": same,
                "bleu": round(bleu.score, 2),
            }
        results[size] = rows
    signature = str(metric.get_signature())
    write(results, len(sources), threads, signature, args.out)


def write(results: dict[int, dict], n: int, threads: int, signature: str, out: Path) -> None:
    lines = [
        f"Beam 5 on {n} test verses, {threads} threads, fp32, side by side in one run "
        f"(BLEU: {signature}).",
        "",
        "| batch | method | seconds | speed vs fairseq2 | identical to fairseq2 | BLEU |",
        "|---|---|---|---|---|---|",
    ]
    for size, rows in results.items():
        for name, r in rows.items():
            lines.append(
                f"| {size} | {name} | {r['seconds']:.2f} | {r['speedup_vs_fairseq2']:.2f}× | "
                f"{r['identical_to_fairseq2']}/{n} | {r['bleu']:.2f} |"
            )
    spec_vs_ct2 = {
        size: rows["CTranslate2 beam"]["seconds"] / rows["specbeam spec_beam"]["seconds"]
        for size, rows in results.items()
    }
    lines += ["", "specbeam vs CTranslate2: " + ", ".join(
        f"{r:.2f}× at batch {s}" for s, r in spec_vs_ct2.items()
    )]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "ct2.md").write_text("\n".join(lines) + "\n")
    (out / "ct2.json").write_text(json.dumps({"results": results, "sentences": n, "threads": threads, "bleu_signature": signature}, indent=1) + "\n")  # fmt: skip
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(next(iter(results.values())))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + j * width for i in range(len(results))]
        ys = [rows[name]["speedup_vs_fairseq2"] for rows in results.values()]
        ax.bar(xs, ys, width, label=name)
        for x, y in zip(xs, ys, strict=True):
            ax.text(x, y, f"{y:.2f}×", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + width for i in range(len(results))], [f"batch {s}" for s in results])
    ax.set_ylabel("speed vs fairseq2 beam search")
    ax.set_title(f"Beam 5, {n} test verses, {threads} threads, fp32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ct2.png", dpi=120)


if __name__ == "__main__":
    main()
