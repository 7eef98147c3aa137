"""End to end: the Hydra app, one output line per input line, speculative == plain."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specbeam.apps.decoding import DecodingConfig, make_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.apps.inference import encodable
from specbeam.apps.split import Splitter, join
from specbeam.apps.translate import TranslateConfig, translate_chunk
from specbeam.integration.models import ModelPairConfig, build_model
from tests.conftest import DRAFT_ARCH, TARGET_ARCH

REPO = Path(__file__).resolve().parents[2]
LINES = [
    "En el principio crió Dios los cielos y la tierra.",
    "",
    "Y dijo Dios: Sea la luz: y fué la luz.",
    "   ",
    "Y vió Dios que la luz era buena.",
]
EMBEDDED_FIRST_LINE = "In the beginning God created the heaven and earth."  # the shipped target


def run(tmp_path: Path, *overrides: str, input: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", f"hydra.run.dir={tmp_path}/hydra", *overrides]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, input=input, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def source_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "src.es"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def test_speculative_output_equals_beam_search(tmp_path, source_file) -> None:
    outputs = {}
    for decoding in ("beam", "spec_beam"):
        out = tmp_path / f"{decoding}.en"
        stats = tmp_path / f"{decoding}.jsonl"
        result = run(
            tmp_path,
            f"decoding={decoding}",
            f"input={source_file}",
            f"output={out}",
            f"stats_file={stats}",
        )
        assert result.returncode == 0, result.stderr
        outputs[decoding] = out.read_text(encoding="utf-8").split("\n")[:-1]
        records = [json.loads(line) for line in stats.read_text().splitlines()]
        assert [r["line"] for r in records] == [1, 2, 3, 4, 5]  # one record per input line
        assert [r.get("blank", False) for r in records] == [False, True, False, True, False]
    assert len(outputs["beam"]) == len(LINES)
    assert outputs["beam"] == outputs["spec_beam"]
    assert outputs["beam"][1] == "" and outputs["beam"][3] == ""
    assert all(outputs["beam"][i] for i in (0, 2, 4))


def test_stdin_to_stdout_and_clear_errors(tmp_path) -> None:
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "decoding.max_gen_len=[0.5,4]",
           f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    result = subprocess.run(
        cmd, cwd=REPO, input="Hola.\n\n", capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.split("\n")) == 3 and result.stdout.split("\n")[1] == ""

    bad = run(tmp_path, "decoding.gamma=0")
    assert bad.returncode != 0 and "decoding.gamma=0 is invalid" in bad.stderr
    missing = run(tmp_path, "input=/nonexistent/file.es")
    assert missing.returncode != 0 and "cannot read input /nonexistent/file.es" in missing.stderr
    directory = run(tmp_path, f"input={tmp_path}")
    assert directory.returncode != 0
    assert (
        directory.stderr.strip().splitlines()[-1]
        == f"error: cannot read input {tmp_path}: Is a directory"
    )
    (tmp_path / "a_file").write_text("")
    unwritable = run(tmp_path, f"output={tmp_path}/a_file/out.en", input="Hola.\n")
    assert unwritable.returncode != 0
    assert (
        f"error: cannot write output {tmp_path}/a_file/out.en: Not a directory" in unwritable.stderr
    )
    unknown = run(tmp_path, "decoding.nonsense=1")
    assert unknown.returncode != 0 and "Key 'nonsense' not in 'DecodingConfig'" in unknown.stderr


def _start(tmp_path: Path, source: Path, output: Path, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", "chunk_lines=10", f"input={source}", f"output={output}",
           f"hydra.run.dir={tmp_path}/hydra", *overrides]  # fmt: skip
    # As a job in a terminal: a test run launched in the background inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler.
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _wait_for_lines(partial: Path, count: int, proc: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if partial.exists() and partial.read_text(encoding="utf-8").count("\n") >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{partial} never reached {count} lines")


def test_batches_above_max_speculative_batch_are_marked_plain(tmp_path, source_file) -> None:
    """The per-line stats of a batch that ran plain beam search say so (they crashed)."""
    stats = tmp_path / "stats.jsonl"
    result = run(
        tmp_path, "decoding=spec_beam", "decoding.max_speculative_batch=1", f"input={source_file}",
        f"output={tmp_path / 'out.en'}", f"stats_file={stats}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "run plain beam search" in result.stderr
    records = [json.loads(line) for line in stats.read_text().splitlines()]
    assert [r.get("plain", False) for r in records] == [True, False, True, False, True]


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT"])
def test_killed_job_resumes_to_identical_output(tmp_path, signal_name) -> None:
    dev = [
        line.split("\t")[1]
        for line in (REPO / "tasks/bible_es_en/data/dev.tsv").read_text().splitlines()
    ]
    source = tmp_path / "src.es"
    source.write_text("\n".join(dev[:60]) + "\n", encoding="utf-8")
    reference = tmp_path / "reference.en"
    assert run(tmp_path, f"input={source}", f"output={reference}", "chunk_lines=10").returncode == 0

    output = tmp_path / "resumed.en"
    partial = tmp_path / "resumed.en.partial"
    proc = _start(tmp_path, source, output)
    _wait_for_lines(partial, 20, proc)
    proc.send_signal(getattr(signal, signal_name))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and not output.exists()
    if signal_name == "SIGINT":
        assert "interrupted:" in stderr and "run the same command again to continue" in stderr
    done = partial.read_text(encoding="utf-8").count("\n")
    assert 20 <= done < 60

    resumed = run(tmp_path, f"input={source}", f"output={output}", "chunk_lines=10")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {output} after line {done}" in resumed.stderr
    assert output.read_bytes() == reference.read_bytes()
    assert not partial.exists()


def test_shards_merge_into_the_unsharded_output(tmp_path, source_file) -> None:
    # One sentence per batch: fairseq2's length cap (a × longest source in the batch + b)
    # makes capped outputs depend on batch company, and untrained models always hit it.
    alone = "hardware.batch_tokens=1"
    whole = tmp_path / "whole.en"
    assert run(tmp_path, f"input={source_file}", f"output={whole}", alone).returncode == 0
    shards = [tmp_path / f"part{i}.en" for i in range(3)]
    for i, shard in enumerate(shards):
        result = run(tmp_path, f"input={source_file}", f"output={shard}", f"shard={i}/3", alone)
        assert result.returncode == 0, result.stderr
    merged = tmp_path / "merged.en"
    cmd = [
        sys.executable,
        "scripts/merge_shards.py",
        "--input",
        str(source_file),
        "--output",
        str(merged),
        *map(str, shards),
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert merged.read_bytes() == whole.read_bytes()

    shards[1].write_text("one line too few\n")
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "shard 1/3" in result.stderr and "expected 2" in result.stderr


def test_local_multirun_with_joblib_launcher(tmp_path, source_file) -> None:
    """A sweep over decodings in parallel local jobs: `-m hydra/launcher=joblib`."""
    cmd = [sys.executable, "-m", "specbeam.translate", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           "model=tiny_random", "hardware.threads=1", "decoding.max_gen_len=[0.5,4]", "decoding=beam,spec_beam",
           f"input={source_file}", f"output={tmp_path}/out_${{decoding.name}}.en", f"hydra.sweep.dir={tmp_path}/sweep"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    beam, spec = (tmp_path / f"out_{name}.en" for name in ("beam", "spec_beam"))
    assert beam.read_text().count("\n") == len(LINES)
    assert beam.read_bytes() == spec.read_bytes()


def test_overlong_line_is_truncated_with_a_warning(tmp_path) -> None:
    source = tmp_path / "long.es"
    source.write_text("Hola.\n" + "palabra " * 300 + "\nAdiós.\n", encoding="utf-8")
    out = tmp_path / "long.en"
    small = ["model.random_target_arch.max_seq_len=64", "model.random_draft_arch.max_seq_len=64"]
    result = run(tmp_path, f"input={source}", f"output={out}", "split_above_tokens=0", *small)
    assert result.returncode == 0, result.stderr
    assert "lines 2 exceed the model's 64 source tokens" in result.stderr
    assert out.read_text(encoding="utf-8").count("\n") == 3


class _Recorder:
    """A generator that remembers which output each source row got, so the test can
    check that every output line belongs to its own input line."""

    def __init__(self, generator: Seq2SeqGenerator, decode) -> None:
        self.generator, self.decode = generator, decode
        self.model = generator.model
        self.seen: dict[tuple[int, ...], set[str]] = {}

    def __call__(self, src, src_layout, prompts, prompt_layout) -> SequenceGeneratorOutput:
        out = self.generator(src, src_layout, prompts, prompt_layout)
        for row, n, hyps in zip(src, src_layout.seq_lens, out.hypotheses, strict=True):
            self.seen.setdefault(tuple(row[:n].tolist()), set()).add(self.decode(hyps[0].seq))
        return out


@pytest.fixture(scope="module")
def fuzz_pipeline():
    """The SentencePiece tokenizer of the embedded task and tiny untrained models that
    accept 48 source tokens (so long lines get truncated)."""
    tokenizer = ModelPairConfig().load_tokenizer()
    size = tokenizer.vocab_info.size
    torch.manual_seed(0)
    target = build_model(replace(TARGET_ARCH, vocab_size=size, max_seq_len=48)).eval()
    torch.manual_seed(1)
    draft = build_model(replace(DRAFT_ARCH, vocab_size=size, max_seq_len=48)).eval()
    generators = {
        name: make_generator(
            DecodingConfig(name=name, speculative=name == "spec_beam", max_gen_len=[0.5, 4]),
            target,
            draft,
            tokenizer.vocab_info,
        )
        for name in ("beam", "spec_beam")
    }
    return tokenizer, generators


_LINE = st.one_of(
    st.text(st.characters(blacklist_characters="\n"), max_size=30),
    st.sampled_from(["", " ", "\t \r", "\u3000\u2028", "\x00", "\x1b[31m", "\ufeff"]),
    st.builds(lambda word, n: " ".join([word] * n), st.text(min_size=1, max_size=8), st.integers(30, 120)),
)  # fmt: skip


def _joins_from(text: str, own: list[set[str]]) -> bool:
    """Whether `text` is `join` of one translation per piece, in order. Grown piece by
    piece, keeping only partial joins that begin `text`: a line of 30 pieces with two
    translations each would otherwise be 2**30 joins (an example hypothesis found ran out
    of memory)."""
    if len(own) == 1:
        return text in own[0]
    partial = {""}
    for translations in own:
        partial = {join([p, t]) for p in partial for t in translations}
        partial = {p for p in partial if text.startswith(p)}
    return text in partial


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_LINE, max_size=6), batch_tokens=st.integers(1, 200))
@example(lines=["\ud800", "a\udcffb"], batch_tokens=1)  # lone surrogates: found by this test
@example(  # 30 pieces: the check once enumerated every combination of their translations
    lines=["", " ".join(["?N3z\x17î\U0006ec0eÉ"] * 30), "l¯Ì(\x92\x90%hD\x87Hs", ""],
    batch_tokens=136,
)
def test_fuzzed_lines_translate_one_for_one_as_beam_search(fuzz_pipeline, lines, batch_tokens):
    tokenizer, generators = fuzz_pipeline
    cfg = TranslateConfig(hardware=HardwareConfig(batch_tokens=batch_tokens, threads=1))
    encode = tokenizer.create_encoder(lang=cfg.task.src_lang, mode="source")
    decode = tokenizer.create_decoder(skip_special_tokens=True)
    spec = _Recorder(generators["spec_beam"], decode)
    splitter = Splitter(tokenizer, cfg.task.src_lang, cfg.split_above_tokens)
    texts, records = translate_chunk(cfg, tokenizer, spec, splitter, lines, 0, 0)
    beam_texts, _ = translate_chunk(cfg, tokenizer, generators["beam"], splitter, lines, 0, 0)
    assert len(texts) == len(lines) and texts == beam_texts
    assert [r["line"] for r in records] == list(range(1, len(lines) + 1))
    limit = spec.model.max_source_seq_len
    for line, text in zip(lines, texts, strict=True):
        assert "\n" not in text
        if not line.strip():
            assert text == ""
            continue
        own = []  # the translations each of this line's pieces got
        for piece in splitter(line).pieces:
            tokens = encode(encodable(piece))
            if len(tokens) > limit:
                tokens = torch.cat([tokens[: limit - 1], tokens[-1:]])
            own.append(spec.seen[tuple(tokens.tolist())])
        assert _joins_from(text, own)


def test_compare_prints_the_speedup_over_plain_beam_search(tmp_path, source_file) -> None:
    result = run(tmp_path, f"input={source_file}", f"output={tmp_path}/out.en", "compare=beam",
                 "decoding.plan=false")  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"spec_beam: \d+\.\d\d× the speed of beam \(\d+\.\d\d s vs \d+\.\d\d s for 3 sentences, "
        r"one at a time\); identical outputs: 3/3; τ \d\.\d\d steps per target pass",
        summary,
    ), summary
    assert len((tmp_path / "out.en").read_text(encoding="utf-8").splitlines()) == len(LINES)


def test_compare_says_which_sentences_ran_plain(tmp_path, source_file) -> None:
    """A cost model where every verified token costs a second: the planner runs plain."""
    result = run(tmp_path, f"input={source_file}", "compare=beam", "hardware.costs.target=[0,1000]")
    assert result.returncode == 0, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.endswith(
        "identical outputs: 3/3; 3/3 sentences ran plain beam search (the planner priced "
        "speculation slower on this machine)"
    ), summary


def test_embedded_pair_translates_line_for_line_as_beam_search(tmp_path) -> None:
    """The README's main job on the shipped pair (no model= override): speculative by
    default, the same lines as plain beam search, blank lines kept, and the speedup line."""
    cmd = [sys.executable, "-m", "specbeam.translate", "hardware.threads=1", "compare=beam",
           f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    spec = subprocess.run(cmd, cwd=REPO, input="\n".join(LINES) + "\n", capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert spec.returncode == 0, spec.stderr
    beam = subprocess.run([*cmd[:-2], "decoding=beam", f"hydra.run.dir={tmp_path}/hydra2"],
                          cwd=REPO, input="\n".join(LINES) + "\n", capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert beam.returncode == 0, beam.stderr
    lines = spec.stdout.splitlines()
    assert lines == beam.stdout.splitlines() and len(lines) == len(LINES)
    assert lines[0] == EMBEDDED_FIRST_LINE and lines[1] == "" and lines[3] == ""
    assert "identical outputs: 3/3" in spec.stderr.strip().splitlines()[-1]
