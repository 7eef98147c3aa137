"""torch.compile (inductor, CPU) of the lean target call, against the lean path as shipped.

    .venv/bin/python scripts/bench_compile.py                    # inductor packs the weights
    .venv/bin/python scripts/bench_compile.py --variant opaque   # our oneDNN linears, opaque

The compiled module is the whole decoder stack of the embedded target (one graph, dynamic
shapes). Keys of the new slots leave the graph and are written to the cache outside it: a
slice write inside makes functionalization copy the whole cache buffer per layer (45.6 vs
21.7 ms per call at 5 slots). `freeze` lets inductor pack the weights for oneDNN and fuse
the residual adds into the products, and bypasses inductor's graph cache; `opaque` keeps
`specbeam.search.onednn.linear` as a custom op, so the compiled graph is cached across runs
but fuses only the norms. Prints the compile time, the graph-cache counters, the largest
logit difference and ms per call at 5, 11 and 27 verified slots, interleaved rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from torch import Tensor
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import load_config  # noqa: E402

from specbeam.apps.data import pad  # noqa: E402
from specbeam.integration.models import load_pair  # noqa: E402
from specbeam.search import onednn  # noqa: E402
from specbeam.search.lean_decoder import LeanDecoder  # noqa: E402
from specbeam.search.slots import SlotTable  # noqa: E402
from specbeam.search.tree_attention import TreeDecoder  # noqa: E402


@torch.library.custom_op("specbeam_bench::linear", mutates_args=())
def opaque_linear(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return onednn.linear(x, weight, bias)


@opaque_linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.size(0)))


_QKV = ("q_proj", "k_proj", "v_proj")


def _norm(x: Tensor, norm: torch.nn.Module) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _attend(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).flatten(2)


class Stack(torch.nn.Module):
    """The lean decoder's arithmetic (q/k/v stacked) as one module; returns the new keys
    and values, (layers, S, T, H, D) each, for the caller to cache."""

    def __init__(self, decoder: torch.nn.Module, linear) -> None:
        super().__init__()
        self.layers, self.norm, self.linear = decoder.layers, decoder.layer_norm, linear

        def stacked(name: str) -> torch.nn.ParameterList:
            return torch.nn.ParameterList(
                torch.nn.Parameter(
                    torch.cat([getattr(getattr(lay.self_attn, p), name) for p in _QKV]).detach(),
                    requires_grad=False,
                )
                for lay in decoder.layers
            )

        self.qkv_weight, self.qkv_bias = stacked("weight"), stacked("bias")

    def forward(self, x, past_k, past_v, self_bias, cross_k, cross_v, cross_bias):
        lin, new_k, new_v = self.linear, [], []
        for i, layer in enumerate(self.layers):
            a, heads = layer.self_attn, layer.self_attn.num_heads
            qkv = lin(_norm(x, layer.self_attn_layer_norm), self.qkv_weight[i], self.qkv_bias[i])
            q, k, v = (t.unflatten(-1, (heads, -1)) for t in qkv.chunk(3, -1))
            new_k.append(k)
            new_v.append(v)
            keys, values = torch.cat([past_k[i], k], 1), torch.cat([past_v[i], v], 1)
            x = x + lin(
                _attend(q, keys, values, self_bias), a.output_proj.weight, a.output_proj.bias
            )
            c = layer.encoder_decoder_attn
            q = lin(_norm(x, layer.encoder_decoder_attn_layer_norm), c.q_proj.weight, c.q_proj.bias)
            out = _attend(q.unflatten(-1, (heads, -1)), cross_k[i], cross_v[i], cross_bias)
            x = x + lin(out, c.output_proj.weight, c.output_proj.bias)
            f = layer.ffn
            h = lin(_norm(x, layer.ffn_layer_norm), f.inner_proj.weight, f.inner_proj.bias)
            x = x + lin(f.inner_activation(h), f.output_proj.weight, f.output_proj.bias)
        return _norm(x, self.norm), torch.stack(new_k), torch.stack(new_v)


class CompiledDecoder(LeanDecoder):
    """The lean decoder's call through `fn` (a `Stack`, compiled or not)."""

    fn: torch.nn.Module

    def __call__(
        self, x: Tensor, self_bias: Tensor, cross_bias: Tensor | None, taps: Sequence[int] = ()
    ) -> tuple[Tensor, list[Tensor]]:
        if taps:
            raise ValueError("the compiled stack returns no layer outputs")
        cache = self.self_states[0]._cache
        start, num_new = cache.prefix_keys() + cache.spec_len, x.size(1)
        for state in self.self_states:
            state._new = num_new
        flat = cache.flat()  # (layers, 2, S, keys, H, D)
        cross = [state.get() for state in self.cross_states]
        out, new_k, new_v = self.fn(
            x,
            list(flat[:, 0, :, :start].unbind(0)),
            list(flat[:, 1, :, :start].unbind(0)),
            self_bias,
            [k for k, _ in cross],
            [v for _, v in cross],
            cross_bias,
        )
        flat[:, 0, :, start : start + num_new] = new_k
        flat[:, 1, :, start : start + num_new] = new_v
        return out, []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("freeze", "opaque"), default="freeze")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    inductor_config.freezing = args.variant == "freeze"
    cfg = load_config("bible_es_en", "cpu")
    cfg.hardware.apply()
    tokenizer = cfg.model.load_tokenizer()
    target, _ = load_pair(cfg.model, tokenizer.vocab_info.size, with_draft=False)
    encode = tokenizer.create_encoder(lang=cfg.task.src_lang, mode="source")
    source, layout = pad([encode(cfg.task.split("test")[0].source)], 0)
    with torch.inference_mode():
        decoder = TreeDecoder(target, source, layout, hyps_per_source=5, capacity=400,
                              capacity_increment=16, lean=True)  # fmt: skip
        decoder.cache.reserve(300)
        decoder.cache.lens[:] = 30  # 30 positions of 5 hypotheses cached, as mid-sentence
        decoder.cache.width = 30
        eager = decoder.lean
        assert eager is not None
        compiled = CompiledDecoder(eager.decoder, eager.self_states, eager.cross_states)
        linear = F.linear if args.variant == "freeze" else opaque_linear
        compiled.fn = torch.compile(Stack(eager.decoder, linear).eval(), dynamic=True)

        def call(slots: int) -> Tensor:
            table = SlotTable(1, slots, source.device)
            chains = torch.zeros(1, 5, 1, dtype=torch.long)
            table.add_chains(chains, torch.ones(1, dtype=torch.long), decoder.cache.lens)
            nodes = torch.zeros(1, slots - 5, dtype=torch.long)
            table.add_nodes(nodes, nodes, torch.ones(1, slots - 5, dtype=torch.bool))
            hidden = decoder.forward(*table.query(0, table.size))
            decoder.cache.spec_len = 0
            return decoder.logits(hidden)

        decoder.lean = compiled
        started = time.perf_counter()
        for slots in (5, 27, 11):
            call(slots)
        print(f"compile and first calls: {time.perf_counter() - started:.1f} s")
        print("inductor:", {k: v for k, v in counters["inductor"].items() if "cache" in k})
        for slots in (5, 11, 27):
            decoder.lean = eager
            reference = call(slots)
            decoder.lean = compiled
            diff = (reference - call(slots)).abs().max().item()
            totals = {"lean": 0.0, "compiled": 0.0}
            for _ in range(args.rounds):
                for name, lean in (("lean", eager), ("compiled", compiled)):
                    decoder.lean = lean
                    call(slots)
                    started = time.perf_counter()
                    for _ in range(5):
                        call(slots)
                    totals[name] += (time.perf_counter() - started) / 5
            lean_ms, compiled_ms = (1000 * totals[n] / args.rounds for n in ("lean", "compiled"))
            print(f"{slots:3d} slots: lean {lean_ms:6.2f} ms, compiled {compiled_ms:6.2f} ms, "
                  f"x{lean_ms / compiled_ms:.3f}, max logit diff {diff:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
