"""The compiled layer loop computes bit for bit what the lean decoder's Python loop does
(same ATen ops, same kernels, same packed copies), packed or not, with taps, on targets
and draft heads; where it cannot be built, decoding goes on in Python and says why."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from specbeam.data.batches import pad
from specbeam.kernels import native, onednn
from specbeam.kernels.lean_decoder import Packing
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.slots import SlotTable
from specbeam.search.tree_attention import TreeDecoder, tree_bias
from tests.conftest import NLLB_PROMPT, sources
from tests.search.test_tree_attention import random_tree


def test_the_extension_builds_here() -> None:
    """CI's machine has a compiler (scripts/setup.sh installs g++): the other tests here
    would otherwise compare the Python path with itself."""
    assert native.build() is not None


def test_every_source_file_is_built() -> None:
    """A .cpp left out of `SOURCES` is neither compiled nor part of the build's hash: its
    functions would be missing from a build that looks current."""
    assert sorted(native.CSRC.glob("*.cpp")) == sorted(native.SOURCES)


def test_its_loops_share_torchs_threads() -> None:
    """ATen's `parallel_for` runs on one thread in code compiled without OpenMP; built with
    it, the extension calls the OpenMP runtime torch loaded (by its soname; wheels such as
    sentencepiece's bring runtimes of their own under other names), not a second one."""
    symbols = subprocess.run(
        ["nm", "-D", str(native.build_dir() / f"{native.NAME}.so")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "GOMP_parallel" in symbols
    loaded = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
    runtimes = {path for path in loaded if path.endswith("/libgomp.so.1")}
    assert runtimes == {str(Path(torch.__file__).parent / "lib" / "libgomp.so.1")}


@pytest.mark.parametrize("min_rows", [1, 10_000], ids=["onednn", "mkl"])
def test_native_layers_match_the_python_loop_bit_for_bit(
    tiny_target, monkeypatch, min_rows, use_runtime, kernel_attention
) -> None:
    """Rounds of tree calls on a padded batch, every other one packed, reading taps, and
    commits: the same masks, states, taps, logits and cache contents whichever loop ran."""
    use_runtime(onednn_min_rows=min_rows)
    monkeypatch.setattr(onednn, "PACK_AFTER", 1)  # MKL's packed GEMM from the first call
    gen = torch.Generator().manual_seed(5)
    k, srcs = 2, sources(seed=23, batch=3)
    src, layout = pad(srcs, 0)
    decoders = [
        TreeDecoder(tiny_target, src, layout, hyps_per_source=k, capacity=64, lean=True, taps=(0,))
        for _ in range(2)
    ]
    assert all(d.lean is not None and d.lean.native is not None for d in decoders)
    with torch.inference_mode():
        for round_nr in range(4):
            table = SlotTable(3, k + 8, torch.device("cpu"))
            last = torch.randint(4, 48, (3, k, 1), generator=gen)
            roots = table.add_chains(last, torch.ones(3, dtype=torch.int64), decoders[0].cache.lens)
            random_tree(table, roots, gen, depth=2, width=4)
            packing = None
            if round_nr % 2:
                table.valid[:, k:] &= torch.rand(3, 8, generator=gen) < 0.5
                seen = table.visible[:, : table.size, : table.size]
                valid = table.valid[:, : table.size]
                valid &= ~(seen & ~valid[:, None, :]).any(-1)
                packing = Packing.of(valid)
                assert packing is not None
            results = []
            for use_native, dec in zip((False, True), decoders, strict=True):
                use_runtime(native=use_native)
                hidden = dec.forward(*table.query(0, table.size), packing=packing)
                column = dec.cache.prefix_columns(table.hyp)
                bias = tree_bias(dec.cache.lens, 2, column, table.visible, torch.float32)
                results.append((hidden, dec.logits(hidden, packing), dec.features(hidden), bias))
            for want, got in zip(*results, strict=True):
                assert torch.equal(want, got), (want - got).abs().max()
            assert torch.equal(decoders[0].cache.buf, decoders[1].cache.buf)
            chosen = torch.randint(k, k + 4, (3, k), generator=gen)
            if packing is not None:  # all of a source's hypotheses keep as many slots
                ok = valid.gather(1, chosen).all(1, keepdim=True)
                chosen = torch.where(ok, chosen, torch.arange(k))
            keep = table.visible[torch.arange(3)[:, None], chosen, : table.size]
            origin = torch.randint(0, k, (3, k), generator=gen)
            for use_native, dec in zip((False, True), decoders, strict=True):
                use_runtime(native=use_native)  # the prefixes' reorder is compiled too
                dec.cache.commit(origin, keep)


def test_a_kept_resolution_follows_the_packing_of_recurring_rows(
    tiny_target, monkeypatch, use_runtime
) -> None:
    """A call's products are resolved once per row count and kept, but not while MKL still
    counts uses before packing a weight: the kept products are the packed ones."""
    use_runtime(onednn_min_rows=10_000)  # every fp32 product on MKL
    monkeypatch.setattr(onednn, "PACK_AFTER", 3)
    monkeypatch.setattr(onednn, "_row_packs", onednn._PerTensor())  # none packed yet
    src, layout = pad(sources(seed=7, batch=2), 0)
    dec = TreeDecoder(tiny_target, src, layout, hyps_per_source=2, capacity=32, lean=True)
    assert dec.lean is not None and dec.lean.native is not None
    layers = dec.lean.native
    rows = 2 * 4
    kinds = []
    with torch.inference_mode():
        for _ in range(onednn.PACK_AFTER + 1):
            resolved = layers._resolve(rows, torch.float32)
            assert resolved is not None
            kinds.append(set(resolved.ints[:6]))
        assert layers._resolve(rows, torch.float32) is resolved  # kept from then on
    assert kinds[0] == {onednn.TORCH} and kinds[-1] == {onednn.MKL}


def test_calls_off_the_cpu_run_the_portable_path(tiny_target, monkeypatch) -> None:
    """The extension, oneDNN's and MKL's kernels are CPU-only: a decoder whose tensors
    live elsewhere (here on the meta device, which computes shapes only) calls none of
    them, and runs the torch path."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a CPU-only kernel was chosen for tensors off the CPU")

    class Refusing:
        def __getattr__(self, _name: str):
            return refuse

    monkeypatch.setattr(native, "build", Refusing)
    monkeypatch.setattr(onednn, "_runs", refuse)
    monkeypatch.setattr(onednn, "_mkl_few_rows", refuse)
    meta = torch.device("meta")
    model = copy.deepcopy(tiny_target).to(meta)
    src, layout = pad(sources(seed=3, batch=2), 0)
    with torch.inference_mode():
        dec = TreeDecoder(model, src.to(meta), layout, hyps_per_source=2, capacity=16, lean=True)
        assert dec.lean is not None and dec.lean.native is not None
        table = SlotTable(2, 4, meta)
        tokens = torch.full((2, 2, 2), 3, device=meta)
        table.add_chains(tokens, torch.full((2,), 2, device=meta), dec.cache.lens)
        logits = dec.logits(dec.forward(*table.query(0, table.size)))
    assert logits.shape == (2, 4, 48) and logits.device == meta
    assert native.module_for(logits) is None


@pytest.mark.parametrize("draft", ["random_head", "fused_head", "tiny_draft"])
def test_speculative_search_is_the_same_on_either_loop(
    request, tiny_target, vocab_info, draft, use_runtime, kernel_attention
) -> None:
    drafter = request.getfixturevalue(draft)
    srcs = sources(seed=41, batch=3)
    src, src_layout = pad(srcs, 0)
    prompts, prompt_layout = pad([NLLB_PROMPT] * len(srcs), 0)
    outputs = []
    for use_native in (False, True):
        use_runtime(native=use_native)
        generator = SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, drafter, vocab_info, beam_size=3, gamma=2, draft_width=4,
            max_gen_len=(2.0, 6), lean_draft=True, lean_target=True,
        )  # fmt: skip
        outputs.append(generator(src, src_layout, prompts, prompt_layout))
    for want, got in zip(outputs[0].hypotheses, outputs[1].hypotheses, strict=True):
        assert [h.seq.tolist() for h in got] == [h.seq.tolist() for h in want]
        assert [float(h.score) for h in got] == [float(h.score) for h in want]  # bit for bit
    assert outputs[0].stats.passes_per_source == outputs[1].stats.passes_per_source


def test_switched_off_or_unbuildable_it_runs_in_python(
    monkeypatch, caplog, tmp_path, use_runtime
) -> None:
    use_runtime(native=False)
    assert native.module() is None
    use_runtime(native=True)
    caplog.set_level(logging.WARNING, logger="specbeam.kernels.native")

    def no_compiler(*_args, **_kwargs):
        raise RuntimeError("Error building extension 'specbeam_native'\nc++: not found")

    monkeypatch.setenv("SPECBEAM_NATIVE_DIR", str(tmp_path))  # nothing built there
    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    assert native.build.__wrapped__() is None
    assert "run in Python: c++: not found" in caplog.text


def test_build_native_help_builds_nothing(tmp_path) -> None:
    """--help of an entry point prints usage; it started a build of minutes."""
    env = {**os.environ, "SPECBEAM_NATIVE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "specbeam.build_native", "--help"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m specbeam.build_native")
    assert list(tmp_path.iterdir()) == []
