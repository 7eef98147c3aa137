"""A generator's runtime: its kernels and spare cache buffers, current for its calls only."""

from __future__ import annotations

import torch
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator

from specbeam.data.batches import pad
from specbeam.kernels import native, onednn
from specbeam.kernels.runtime import Runtime, RuntimeConfig, SpareBuffers
from specbeam.search.config import MachineSettings, SpeculativeSearchConfig
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from tests.conftest import NLLB_PROMPT, sources
from tests.search.test_generator import assert_same

CPU = torch.device("cpu")


def test_spares_hand_out_zeroed_storage_best_fit_first() -> None:
    spares = SpareBuffers(limit_bytes=4 * 100)
    small, large = spares.take(10, torch.float32, CPU), spares.take(50, torch.float32, CPU)
    small.fill_(3.0)
    large.fill_(5.0)
    spares.give(large)
    spares.give(small)
    got = spares.take(8, torch.float32, CPU)
    assert got.data_ptr() == small.data_ptr() and (got[:8] == 0).all()
    assert spares.take(8, torch.float32, CPU).data_ptr() == large.data_ptr()
    assert spares.take(8, torch.float32, CPU).data_ptr() not in (small.data_ptr(), large.data_ptr())
    assert spares.take(8, torch.float16, CPU).dtype == torch.float16  # never another dtype's


def test_spares_keep_no_more_than_their_limit() -> None:
    spares = SpareBuffers(limit_bytes=4 * 60)
    buffers = [spares.take(n, torch.float32, CPU) for n in (10, 20, 40)]
    for b in buffers:
        spares.give(b)
    # 70 elements exceed the limit: the smallest is dropped.
    assert sorted(b.numel() for b in spares._free) == [20, 40]


def test_spares_of_inference_mode_stay_there() -> None:
    spares = SpareBuffers(limit_bytes=2**20)
    with torch.inference_mode():
        spares.give(spares.take(10, torch.float32, CPU))
    outside = spares.take(10, torch.float32, CPU)
    assert not outside.is_inference()
    outside.add_(1.0)  # writable here


def test_a_runtime_is_current_only_within_its_block() -> None:
    default = Runtime.current()
    off = Runtime(RuntimeConfig(onednn=False, native=False, onednn_min_rows=3))
    with off.active():
        assert Runtime.current() is off
        assert not onednn.active() and native.module() is None
        assert onednn.settings()[:2] == (False, 3)
    assert Runtime.current() is default


def test_two_generators_in_one_process_keep_their_own_settings(
    tiny_target, tiny_draft, vocab_info, monkeypatch
) -> None:
    """One generator on the compiled layers and oneDNN, one on the portable torch path,
    called in turn: each call runs under its own generator's choices (seen by the layers
    it reaches), keeps its own spare buffers, and both give beam search's output."""
    seen: list[tuple[str, bool]] = []  # (layer, whether it ran its CPU kernel)
    bypassed, build = onednn._bypassed, native.build

    def spy_onednn(dtype, weights) -> bool:
        seen.append(("onednn", not bypassed(dtype, weights)))
        return bypassed(dtype, weights)

    def spy_native():
        seen.append(("native", True))
        return build()

    monkeypatch.setattr(onednn, "_bypassed", spy_onednn)
    monkeypatch.setattr(native, "build", spy_native)
    kernels = {
        "compiled": MachineSettings(onednn=True, native=True),
        "portable": MachineSettings(onednn=False, native=False, spare_cache_mb=1),
    }
    gens = {
        name: SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target,
            tiny_draft,
            vocab_info,
            config=SpeculativeSearchConfig(machine=machine),
            beam_size=3,
            gamma=2,
            max_gen_len=(2.0, 6),
        )  # fmt: skip
        for name, machine in kernels.items()
    }
    beam = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=3, max_gen_len=(2.0, 6))
    src, src_layout = pad(sources(seed=12, batch=3), 0)
    prompts, prompt_layout = pad([NLLB_PROMPT] * 3, 0)
    want = beam(src, src_layout, prompts, prompt_layout)
    for name in ("compiled", "portable", "compiled"):
        seen.clear()
        got = gens[name](src, src_layout, prompts, prompt_layout)
        assert_same(got, want)
        ran = {(layer, on) for layer, on in seen}
        if name == "compiled":
            assert ran == {("onednn", True), ("native", True)}, name
        else:
            assert ran == {("onednn", False)}, name  # the extension is not even asked
    compiled, portable = (gens[n]._runtime.spares for n in ("compiled", "portable"))
    assert compiled is not portable and portable.limit_bytes == 2**20
    assert Runtime.current().onednn and Runtime.current().native  # the defaults again
