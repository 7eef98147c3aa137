"""End to end: the Hydra app, one output line per input line, speculative == plain."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specbeam.apps.decoding import DecodingConfig, make_generator
from specbeam.apps.hardware import HardwareConfig
from specbeam.apps.merge_shards import main as merge_shards
from specbeam.apps.split import Splitter, join
from specbeam.apps.translate import TranslateConfig, translate, translate_chunk, warn_split
from specbeam.data.inference import encodable
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
        f"error: cannot write output {tmp_path}/a_file/out.en: cannot create "
        f"{tmp_path}/a_file/out.en.partial: Not a directory" in unwritable.stderr
    )
    bad_format = run(tmp_path, "output_format=xml")
    assert bad_format.stderr.strip() == "error: output_format=xml is invalid: allowed: text, jsonl"
    unknown = run(tmp_path, "decoding.nonsense=1")
    assert unknown.returncode != 0
    assert (
        unknown.stderr == "error: decoding.nonsense is not a setting (--help lists the settings)\n"
    )


def test_stdin_is_translated_as_lines_arrive(tmp_path, source_file) -> None:
    """A filter in a pipe: a line's translation comes out while stdin is still open;
    then one output line per input line, in order, blank lines kept, as from a file."""
    alone = "hardware.batch_tokens=1"  # batches of one: the same length caps as the file's
    reference = tmp_path / "reference.en"
    assert run(tmp_path, f"input={source_file}", f"output={reference}", alone).returncode == 0
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", alone, f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, encoding="utf-8",
    )  # fmt: skip
    out: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [out.put(line) for line in proc.stdout], daemon=True).start()
    try:
        proc.stdin.write(LINES[0] + "\n")
        proc.stdin.flush()
        first = out.get(timeout=240)  # stdin still open
        assert proc.poll() is None
        proc.stdin.write("\n".join(LINES[1:]) + "\n")
        proc.stdin.close()
        assert proc.wait(timeout=240) == 0
    finally:
        proc.kill()
    rest = [out.get(timeout=10) for _ in LINES[1:]]
    assert out.empty()
    assert [first, *rest] == reference.read_text(encoding="utf-8").splitlines(keepends=True)


def _start(
    tmp_path: Path, source: Path, output: Path, from_stdin: bool, *overrides: str
) -> subprocess.Popen:
    """translate of `source` (or of stdin reading it) into `output`, 10 lines at a time
    unless `overrides` say otherwise."""
    given = "input=-" if from_stdin else f"input={source}"
    chunk = [] if any(o.startswith("chunk_lines=") for o in overrides) else ["chunk_lines=10"]
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", *chunk, given, f"output={output}",
           f"hydra.run.dir={tmp_path}/hydra", *overrides]  # fmt: skip
    # As a job in a terminal: a test run launched in the background inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler.
    with open(source if from_stdin else os.devnull, "rb") as stdin:
        return subprocess.Popen(
            cmd, cwd=REPO, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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
    assert "run exact plain beam search" in result.stderr
    records = [json.loads(line) for line in stats.read_text().splitlines()]
    assert [r.get("plain", False) for r in records] == [True, False, True, False, True]


def _dev_source(tmp_path: Path) -> Path:
    """60 lines of the embedded task's dev set."""
    dev = [
        line.split("\t")[1]
        for line in (REPO / "tasks/bible_es_en/data/dev.tsv").read_text().splitlines()
    ]
    source = tmp_path / "src.es"
    source.write_text("\n".join(dev[:60]) + "\n", encoding="utf-8")
    return source


@pytest.mark.parametrize(
    ("signal_name", "from_stdin"),
    [("SIGKILL", False), ("SIGINT", False), ("SIGTERM", False), ("SIGKILL", True)],
)
def test_killed_job_resumes_to_identical_output(tmp_path, signal_name, from_stdin) -> None:
    """From stdin too: the rerun, given the same input, skips the lines the output has.
    SIGTERM (a scheduler's time limit, `docker stop`) keeps the finished lines as Ctrl-C
    does, each with the shell's exit code for its signal."""
    source = _dev_source(tmp_path)
    reference = tmp_path / "reference.en"
    assert run(tmp_path, f"input={source}", f"output={reference}", "chunk_lines=10").returncode == 0

    output = tmp_path / "resumed.en"
    partial = tmp_path / "resumed.en.partial"
    proc = _start(tmp_path, source, output, from_stdin)
    _wait_for_lines(partial, 20, proc)
    proc.send_signal(getattr(signal, signal_name))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0 and not output.exists()
    if signal_name != "SIGKILL":
        word = {"SIGINT": "interrupted", "SIGTERM": "terminated"}[signal_name]
        assert proc.returncode == 128 + getattr(signal, signal_name)
        assert f"{word}:" in stderr and "run the same command again to continue" in stderr
    done = partial.read_text(encoding="utf-8").count("\n")
    assert 20 <= done < 60
    refused = _refused_resumes(tmp_path, source, output, from_stdin, signal_name)
    assert partial.read_text(encoding="utf-8").count("\n") == done, refused

    if signal_name == "SIGINT":  # the same file, named another way: the same job
        source = source.parent / "." / source.name
    resumed = _start(tmp_path, source, output, from_stdin)
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"resuming {output} after line {done}" in stderr
    assert output.read_bytes() == reference.read_bytes()
    assert not partial.exists()


def _refused_resumes(
    tmp_path: Path, source: Path, output: Path, from_stdin: bool, signal_name: str
) -> list[str]:
    """Reruns that must not continue the partial output, each with its one-line error:
    stdin carrying another text (its first line changed), and stats_file added to the rerun
    (its records of the lines written would be missing)."""
    errors = []
    if from_stdin:
        other = tmp_path / "other.es"
        other.write_text("Otra cosa.\n" + source.read_text(encoding="utf-8").split("\n", 1)[1])
        proc = _start(tmp_path, other, output, from_stdin)
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 1
        assert stderr.strip().splitlines()[-1] == (
            f"error: line 1 of standard input is not the line {output}.partial was translated "
            "from: this is another input; give the same input, or delete the partial file to "
            "translate this one from the start"
        )
        errors.append(stderr)
    if signal_name == "SIGTERM":
        proc = _start(tmp_path, source, output, from_stdin, f"stats_file={tmp_path}/new.jsonl")
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 1
        assert (
            stderr.strip()
            .splitlines()[-1]
            .startswith(f"error: stats_file={tmp_path}/new.jsonl has 0 records of the ")
        )
        assert not list(tmp_path.glob("new.jsonl*"))  # nothing left to resume
        errors.append(stderr)
    return errors


def test_interrupt_inside_a_chunk_keeps_its_finished_lines_and_resumes_exactly(tmp_path) -> None:
    """The whole file is one chunk (chunk_lines=256) of several length-sorted batches.
    The progress bar counts lines as they finish; Ctrl-C writes the chunk's finished
    lines up to its first unfinished one, the stats file in step; the rerun decodes the
    chunk's batches that hold unwritten lines, the same batches, so the same output."""
    source = _dev_source(tmp_path)
    small = "hardware.batch_tokens=200"
    reference, stats = tmp_path / "reference.en", tmp_path / "reference.jsonl"
    done = run(tmp_path, f"input={source}", f"output={reference}", f"stats_file={stats}", small)
    assert done.returncode == 0, done.stderr
    output, partial = tmp_path / "resumed.en", tmp_path / "resumed.en.partial"
    resumed_stats = tmp_path / "resumed.jsonl"
    overrides = ("chunk_lines=256", small, f"stats_file={resumed_stats}")
    proc = _start(tmp_path, source, output, False, *overrides)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(iter(lambda: proc.stderr.read(1), "")))
    reader.start()
    progress = re.compile(r"(\d+)/60")
    while proc.poll() is None and not any(
        0 < int(n) < 60 for n in progress.findall("".join(stderr))
    ):
        threading.Event().wait(0.01)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    message = re.search(
        r"interrupted: (\d+) of 60 lines are in (\S+)"
        r"(?: \((?:(\d+) later lines?)?(?: and )?(?:(\d+) pieces? of split lines)? in (\S+)\))?; "
        "run the same",
        "".join(stderr),
    )
    assert proc.returncode != 0 and message and message[2] == str(partial), "".join(stderr)
    kept, later, pieces = int(message[1]), int(message[3] or 0), int(message[4] or 0)
    if later or pieces:
        ahead = message[5]
        rows = [json.loads(row) for row in Path(ahead).read_text().splitlines()]
        assert ahead == f"{partial}.ahead"
        assert sum("piece" not in row for row in rows) == later
        assert sum("piece" in row for row in rows) == pieces
    assert partial.read_text(encoding="utf-8").count("\n") == kept < 60
    partial_stats = tmp_path / "resumed.jsonl.partial"
    assert [json.loads(r)["line"] for r in partial_stats.read_text().splitlines()] == list(
        range(1, kept + 1)
    )
    again = _start(tmp_path, source, output, False, *overrides)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    ahead = [f"{later} later line{'s' * (later != 1)}"] if later else []
    ahead += [f"{pieces} piece{'s' * (pieces != 1)} of split lines"] if pieces else []
    finished_too = f" ({' and '.join(ahead)} finished too)" if ahead else ""
    assert f"resuming {output} after line {kept}{finished_too}" in err
    assert output.read_bytes() == reference.read_bytes()
    assert [json.loads(r)["line"] for r in resumed_stats.read_text().splitlines()] == list(
        range(1, 61)
    )


def test_interrupted_stdout_says_what_was_written(tmp_path) -> None:
    source = _dev_source(tmp_path)
    proc = _start(tmp_path, source, Path("-"), True)
    first = proc.stdout.readline()  # a chunk is out
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    written = 1 + proc.stdout.read().count("\n")  # after the line buffered by readline
    proc.wait(timeout=120)
    assert first and proc.returncode != 0
    assert err.strip().splitlines()[-1] == f"interrupted: {written} lines were written to stdout"


def test_lines_before_invalid_utf8_are_translated_and_written(tmp_path) -> None:
    """From stdin, and from a file (into its partial file, which a rerun with
    input_errors=replace continues)."""
    data = b"Hola.\nEl Se\xf1or\nY dijo Dios.\n"
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    piped = subprocess.run(cmd, cwd=REPO, input=data, capture_output=True, timeout=300)
    assert piped.returncode != 0
    assert (
        piped.stderr.decode().strip().splitlines()[-1].startswith("error: <stdin>:2: invalid UTF-8")
    )
    assert len(piped.stdout.decode().splitlines()) == 1
    source = tmp_path / "bad.es"
    source.write_bytes(data)
    output = tmp_path / "bad.en"
    result = run(tmp_path, f"input={source}", f"output={output}")
    assert result.returncode != 0 and f"error: {source}:2: invalid UTF-8" in result.stderr
    assert result.stderr.strip().endswith(
        f"; {output}.partial holds the 1 line before it, and the same command with "
        "input_errors=replace continues it"
    )
    assert (tmp_path / "bad.en.partial").read_text(encoding="utf-8").count("\n") == 1


def test_an_unreadable_input_leaves_no_partial_to_block_the_corrected_command(tmp_path) -> None:
    """`input=/bin/ls` fails on its first line: no partial output is left, and an empty one
    (of an older run) does not refuse the rerun with the right input. From stdin into a
    file, the error names the partial file that holds the lines before the bad one."""
    output = tmp_path / "o.en"
    failed = run(tmp_path, "input=/bin/ls", f"output={output}")
    assert failed.returncode == 1 and "error: /bin/ls:1: " in failed.stderr
    assert "partial" not in failed.stderr and not list(tmp_path.glob("o.en*"))
    Path(f"{output}.partial").write_text("")
    Path(f"{output}.partial.json").write_text('{"input": "/bin/ls", "input_sha256": "0"}\n')
    source = tmp_path / "right.es"
    source.write_text("Hola.\n", encoding="utf-8")
    rerun = run(tmp_path, f"input={source}", f"output={output}")
    assert rerun.returncode == 0, rerun.stderr
    assert output.read_text(encoding="utf-8").count("\n") == 1
    assert sorted(p.name for p in tmp_path.glob("o.en*")) == ["o.en"]
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]", f"output={tmp_path}/piped.en"]  # fmt: skip
    piped = subprocess.run(cmd, cwd=REPO, input=b"Hola.\nEl Se\xf1or\n", capture_output=True)
    assert piped.returncode == 1
    assert (
        piped.stderr.decode()
        .strip()
        .splitlines()[-1]
        .endswith(
            f"; {tmp_path}/piped.en.partial holds the 1 line before it, and the same command "
            "with input_errors=replace continues it"
        )
    )


def test_a_filter_leaves_nothing_in_the_working_directory(tmp_path) -> None:
    """No Hydra run directory (./outputs/…), no log file; stderr has no stray blank line."""
    cmd = [sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
           "decoding.max_gen_len=[0.5,4]"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        cmd, cwd=tmp_path, input="Hola.\n", capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    assert not result.stderr.startswith("\n"), repr(result.stderr)


def test_output_that_is_the_input_is_refused(tmp_path) -> None:
    source = tmp_path / "same.es"
    source.write_text("Hola.\n")
    (tmp_path / "link.es").symlink_to(source)
    for output in (source, tmp_path / "link.es"):
        with pytest.raises(ValueError, match=rf"^output={output} is the input file: choose"):
            TranslateConfig(input=str(source), output=str(output)).check()
    with pytest.raises(ValueError, match=r"^stats_file=.* is the input file"):
        TranslateConfig(input=str(source), stats_file=str(tmp_path / "link.es")).check()


def test_the_documented_compare_with_settings_parses_on_the_command_line() -> None:
    """Hydra's grammar takes no bare `=` in a value: the docstring's quoted form."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import specbeam.apps.translate as app

    documented = re.search(r'"(compare=\'beam:beam_size=4\')"', app.__doc__)
    assert documented, app.__doc__
    override = OverridesParser.create().parse_override(documented[1])
    assert override.value() == "beam:beam_size=4"
    cfg = TranslateConfig(compare=override.value())
    cfg.check()
    assert cfg.baseline().beam_size == 4


def test_shards_swept_with_joblib_merge_into_the_unsharded_output(tmp_path, source_file) -> None:
    """README's corpus command: one command line swept over shards writes a file per
    shard (`out.en.shard-i-of-n`, its stats likewise), each with its record (`.json`);
    `specbeam.merge_shards` finds and joins them, every shard's record checked."""
    # One sentence per batch: fairseq2's length cap (a × longest source in the batch + b)
    # makes capped outputs depend on batch company, and untrained models always hit it.
    alone = "hardware.batch_tokens=1"
    whole = tmp_path / "whole.en"
    assert run(tmp_path, f"input={source_file}", f"output={whole}", alone).returncode == 0
    cmd = [sys.executable, "-m", "specbeam.translate", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           "model=tiny_random", "hardware.threads=1", "decoding.max_gen_len=[0.5,4]", alone, "shard=0/3,1/3,2/3",
           f"input={source_file}", f"output={tmp_path}/out.en", f"stats_file={tmp_path}/stats.jsonl",
           f"hydra.sweep.dir={tmp_path}/sweep"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.shard-*")) == [
        *(f"out.en.shard-{i}-of-3{record}" for i in range(3) for record in ("", ".json")),
        *(f"stats.jsonl.shard-{i}-of-3{record}" for i in range(3) for record in ("", ".json")),
    ]
    for name in ("out.en", "stats.jsonl"):
        merge = [sys.executable, "-m", "specbeam.merge_shards", "--input", str(source_file),
                 "--output", str(tmp_path / name)]  # fmt: skip
        result = subprocess.run(merge, cwd=REPO, capture_output=True, text=True, timeout=120)
        done = f"wrote {tmp_path / name}: 5 lines from 3 shards\n"
        assert result.returncode == 0 and result.stderr == done, result.stderr  # no warning
    assert (tmp_path / "out.en").read_bytes() == whole.read_bytes()
    records = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5]


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
    assert "line 2 exceeds the model's 64 source tokens" in result.stderr
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


def test_jsonl_gives_each_line_its_nbest_scores_and_stats(fuzz_pipeline) -> None:
    """One object per input line, `text` as text output writes it; an unsplit line has its
    n best whole-line hypotheses, best first; a split line its joined 1-best (no score)
    and each piece's n-best list; a blank line none. Speculative = plain search."""
    tokenizer, generators = fuzz_pipeline
    lines = ["Y vió Dios que la luz era buena.", "", " ".join([LINES[2]] * 3)]
    text_cfg = TranslateConfig(
        hardware=HardwareConfig(batch_tokens=1, threads=1), split_above_tokens=12
    )
    jsonl_cfg = replace(text_cfg, output_format="jsonl", nbest=3)
    splitter = Splitter(tokenizer, text_cfg.task.src_lang, text_cfg.split_above_tokens)
    texts, _ = translate_chunk(text_cfg, tokenizer, generators["beam"], splitter, lines, 0, 10)
    objects = {}
    for name, generator in generators.items():
        out, records = translate_chunk(jsonl_cfg, tokenizer, generator, splitter, lines, 0, 10)
        objects[name] = [json.loads(line) for line in out]
        assert [o["stats"] for o in objects[name]] == [
            {k: v for k, v in r.items() if k != "line"} for r in records
        ]
    beam, spec = objects["beam"], objects["spec_beam"]
    assert [o["line"] for o in beam] == [11, 12, 13] and [o["text"] for o in beam] == texts
    assert beam[1] == {"line": 12, "text": "", "nbest": [], "stats": {"blank": True}}
    scores = [h["score"] for h in beam[0]["nbest"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert beam[0]["nbest"][0]["text"] == texts[0] and "pieces" not in beam[0]
    assert beam[0]["stats"]["plain"] and "target_passes" in spec[0]["stats"]
    split = beam[2]
    assert split["nbest"] == [{"text": texts[2], "score": None}]
    assert len(split["pieces"]) == split["stats"]["pieces"] > 1
    assert join([p["nbest"][0]["text"] for p in split["pieces"]]) == texts[2]
    assert all(len(p["nbest"]) == 3 for p in split["pieces"])
    for b, s in zip(beam, spec, strict=True):  # exact: the same n-best lists
        assert [t for t, _ in _hypotheses(b)] == [t for t, _ in _hypotheses(s)]
        scores = [[x for _, x in _hypotheses(o) if x is not None] for o in (b, s)]
        assert scores[0] == pytest.approx(scores[1], abs=1e-4)


def _hypotheses(obj: dict) -> list[tuple[str, float | None]]:
    """A jsonl object's hypotheses, the line's then its pieces'."""
    return [(h["text"], h["score"]) for x in (obj, *obj.get("pieces", [])) for h in x["nbest"]]


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"output_format": "xml"}, "output_format=xml is invalid: allowed: text, jsonl"),
        ({"output_format": "jsonl", "nbest": 6}, "nbest=6 is invalid: must be 1 to decoding.beam_size=5"),
        ({"output_format": "jsonl", "nbest": 0}, "nbest=0 is invalid: must be 1 to decoding.beam_size=5"),
        ({"nbest": 2}, "nbest=2 needs output_format=jsonl: text has one translation per line"),
        ({"output_format": "jsonl", "nbest": 2, "decoding": DecodingConfig(name="sample", search="sample")},
         "nbest=2 is invalid: decoding=sample samples one translation per line (nbest=1)"),
        ({"chunk_lines": 0}, "chunk_lines=0 is invalid: must be ≥ 1"),
        ({"shard": "2/2", "input": "src.es"}, "shard=2/2 is invalid: need 0 ≤ i < n"),
        ({"shard": "0of2", "input": "src.es"}, "shard=0of2 is invalid: expected i/n, e.g. 0/4"),
        ({"shard": "0/2"}, "shard=0/2 needs input=FILE: stdin is streamed"),
        ({"compare": "nope"}, "compare=nope is invalid: decoding=nope is unknown; allowed: beam,"),
        ({"compare": "beam:nonsense=1"}, "compare=beam:nonsense=1 is invalid: Key 'nonsense' not in"),
        ({"compare": "spec_beam"}, "compare=spec_beam is speculative: compare with a plain decoding"),
        ({"input": ""}, "input is empty: give a file, or - for stdin"),
        ({"output": " "}, "output is empty: give a file, or - for stdout"),
        ({"output": "new_dir/"}, "output=new_dir/ is a directory: give a file in it"),
        ({"output": "/tmp"}, "output=/tmp is a directory: give a file in it"),
        ({"output": "out.en", "stats_file": "./out.en"},
         "stats_file=./out.en is the output: choose another stats_file (the records would be mixed into the translations)"),
        ({"stats_file": "-"}, "stats_file=- is the output: choose another stats_file"),
        ({"stats_file": ""}, "stats_file is empty: give a file, or - for stdout"),
    ],
)  # fmt: skip
def test_bad_output_settings_are_one_line_errors(settings: dict, expected: str) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        TranslateConfig(**settings).check()


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
    """A cost model where every verified token costs a second: the planner runs plain. On
    an int8 target both decodings run on it, and the line says so."""
    result = run(tmp_path, f"input={source_file}", "compare=beam", "hardware.costs.target=[0,1000]",
                 "hardware.target_dtype=int8")  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary.endswith(
        "one at a time, both on the int8 target); identical outputs: 3/3; 3/3 sentences ran "
        "plain beam search (the planner priced speculation slower on this machine)"
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


def test_a_chunk_after_written_lines_decodes_only_the_batches_it_needs(fuzz_pipeline) -> None:
    """Lines are reported as they finish; a chunk whose first lines an interrupted run
    wrote skips the batches of theirs alone and gives the rest the same translations."""
    tokenizer, generators = fuzz_pipeline
    cfg = TranslateConfig(hardware=HardwareConfig(batch_tokens=40, threads=1))
    lines = [LINES[0], "", LINES[2], "Hola.", LINES[4], "Sí.", " ".join(LINES[::2])]
    splitter = Splitter(tokenizer, cfg.task.src_lang, cfg.split_above_tokens)
    runs = {}
    for written in (0, 3):
        counted = _Counter(generators["spec_beam"])
        finished: dict[int, str] = {}
        translate_chunk(
            cfg, tokenizer, counted, splitter, lines, 0, 0, written=written,
            on_line=lambda i, text, record, finished=finished: finished.setdefault(i, text),
        )  # fmt: skip
        runs[written] = finished, counted.batches
    (whole, all_batches), (rest, fewer_batches) = runs[0], runs[3]
    assert sorted(whole) == list(range(len(lines))) and sorted(rest) == list(range(3, len(lines)))
    assert rest == {i: whole[i] for i in rest}
    assert whole == dict(
        enumerate(translate_chunk(cfg, tokenizer, counted, splitter, lines, 0, 0)[0])
    )
    assert fewer_batches < all_batches


def test_a_chunk_skips_the_batches_of_lines_finished_out_of_order(fuzz_pipeline) -> None:
    """Lines an interrupted run finished after its first unfinished one (`finished`) are
    not decoded again where their batches hold nothing else, nor reported."""
    tokenizer, generators = fuzz_pipeline
    cfg = TranslateConfig(hardware=HardwareConfig(batch_tokens=40, threads=1))
    lines = [LINES[0], "", LINES[2], "Hola.", LINES[4], "Sí.", " ".join(LINES[::2])]
    splitter = Splitter(tokenizer, cfg.task.src_lang, cfg.split_above_tokens)
    runs = {}
    # Batches of 40 tokens: lines {3, 4, 5}, {0, 2} and {6}; the first is finished.
    for written, finished in ((0, set()), (1, {3, 4, 5})):
        counted = _Counter(generators["spec_beam"])
        got: dict[int, str] = {}
        translate_chunk(
            cfg, tokenizer, counted, splitter, lines, 0, 0, written=written, finished=finished,
            on_line=lambda i, text, record, got=got: got.setdefault(i, text),
        )  # fmt: skip
        runs[written] = got, counted.batches
    (whole, all_batches), (rest, fewer_batches) = runs[0], runs[1]
    assert sorted(rest) == [1, 2, 6] and rest == {i: whole[i] for i in rest}
    assert (fewer_batches, all_batches) == (2, 3)


def test_an_interrupt_keeps_later_finished_lines_and_the_rerun_decodes_only_the_rest(
    fuzz_pipeline, tmp_path, monkeypatch, capsys
) -> None:
    """Ctrl-C while a chunk's batches go: the lines finished after the first unfinished
    one are kept beside the partial output (`.partial.ahead`); the rerun writes them
    without decoding their batches again, and its file is an uninterrupted run's."""
    tokenizer, generators = fuzz_pipeline
    lines = [LINES[0], LINES[2], "Hola.", LINES[4], "Sí.", " ".join(LINES[::2]), "", "Y."]
    source = tmp_path / "in.es"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def translated(output: Path, generator: Seq2SeqGenerator) -> None:
        monkeypatch.setattr(TranslateConfig, "build", lambda self: (tokenizer, generator))
        cfg = TranslateConfig(
            input=str(source), output=str(output), stats_file=f"{output}.jsonl",
            hardware=HardwareConfig(batch_tokens=40, threads=1),
        )  # fmt: skip
        translate(cfg)

    reference = _Counter(generators["spec_beam"])
    translated(tmp_path / "reference.en", reference)
    output = tmp_path / "out.en"
    with pytest.raises(SystemExit) as stop:
        translated(output, _Counter(generators["spec_beam"], interrupt_at=2))
    assert stop.value.code == 130  # the shell's code for SIGINT
    message = capsys.readouterr().err.strip().splitlines()[-1]
    ahead = Path(f"{output}.partial.ahead")
    kept = [json.loads(row) for row in ahead.read_text(encoding="utf-8").splitlines()]
    written = Path(f"{output}.partial").read_text(encoding="utf-8").count("\n")
    assert message.startswith(f"interrupted: {written} of {len(lines)} lines are in ")
    assert f"({len(kept)} later line" in message and str(ahead) in message
    want = (tmp_path / "reference.en").read_text(encoding="utf-8").splitlines()
    assert kept and all(k["index"] > written for k in kept)
    assert [k["text"] for k in kept] == [want[k["index"]] for k in kept]

    rerun = _Counter(generators["spec_beam"])
    translated(output, rerun)
    assert output.read_bytes() == (tmp_path / "reference.en").read_bytes()
    assert rerun.batches == reference.batches - 1  # all but the one finished before Ctrl-C
    records = [json.loads(r) for r in Path(f"{output}.jsonl").read_text().splitlines()]
    assert [r["line"] for r in records] == list(range(1, len(lines) + 1))
    assert not ahead.exists() and not Path(f"{output}.partial").exists()


def test_a_finished_shard_records_its_run_and_a_rerun_replaces_the_record(
    fuzz_pipeline, tmp_path, monkeypatch, capsys
) -> None:
    """Each finished shard file (and stats shard) has `<file>.json`: the input's digest,
    the settings and its line count. A shard translated again with decoding=beam is
    refused by merge_shards, naming the settings; a rerun of the shard that is
    interrupted leaves no record (an older run's would vouch for the new file), and
    finished again as the other was, the shards join."""
    tokenizer, generators = fuzz_pipeline
    source = tmp_path / "in.es"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output = tmp_path / "out.en"

    def shard(i: int, generator: Seq2SeqGenerator, decoding: DecodingConfig) -> None:
        monkeypatch.setattr(TranslateConfig, "build", lambda self: (tokenizer, generator))
        cfg = TranslateConfig(
            input=str(source), output=str(output), stats_file=f"{tmp_path}/stats.jsonl",
            shard=f"{i}/2", decoding=decoding, hardware=HardwareConfig(threads=1),
        )  # fmt: skip
        translate(cfg)

    spec_beam = DecodingConfig(max_gen_len=[0.5, 4])
    beam = DecodingConfig(name="beam", speculative=False, max_gen_len=[0.5, 4])
    for i in (0, 1):
        shard(i, generators["spec_beam"], spec_beam)
    record = json.loads(Path(f"{output}.shard-1-of-2.json").read_text(encoding="utf-8"))
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert (record["input"], record["input_sha256"], record["lines"]) == (str(source), digest, 3)
    settings = record["settings"]
    assert (settings["shard"], settings["decoding.name"]) == ("1/2", "spec_beam")
    assert Path(f"{tmp_path}/stats.jsonl.shard-1-of-2.json").exists()

    merge = ["--input", str(source), "--output", str(output)]
    shard(1, generators["beam"], beam)
    with pytest.raises(SystemExit) as refused:
        merge_shards(merge)
    assert refused.value.code == (
        f"error: {output}.shard-0-of-2 and {output}.shard-1-of-2 come from different runs: "
        "decoding spec_beam vs beam; translate every shard with the same settings"
    )
    with pytest.raises(SystemExit):
        shard(1, _Counter(generators["spec_beam"], interrupt_at=1), spec_beam)
    assert Path(f"{output}.shard-1-of-2.partial").exists()
    assert not Path(f"{output}.shard-1-of-2.json").exists()
    shard(1, generators["spec_beam"], spec_beam)
    capsys.readouterr()
    merge_shards(merge)
    assert capsys.readouterr().err == f"wrote {output}: {len(LINES)} lines from 2 shards\n"
    assert output.read_text(encoding="utf-8").count("\n") == len(LINES)


class _Counter:
    """A generator that counts the batches it decodes."""

    def __init__(self, generator: Seq2SeqGenerator, interrupt_at: int = 0) -> None:
        self.generator, self.model, self.batches = generator, generator.model, 0
        self.interrupt_at = interrupt_at  # > 0: Ctrl-C as this batch starts

    def __call__(self, *args: object) -> SequenceGeneratorOutput:
        self.batches += 1
        if self.batches == self.interrupt_at:
            raise KeyboardInterrupt
        return self.generator(*args)


def test_a_multirun_to_stdout_writes_translations_only(tmp_path) -> None:
    """Hydra's launcher lines go to stderr (conf/hydra/hydra_logging/stderr.yaml)."""
    (tmp_path / "in.es").write_text("Hola.\n")
    cmd = [sys.executable, "-m", "specbeam.translate", "-m", "model=tiny_random", "hardware.threads=1",
           "decoding=beam,greedy", "decoding.max_gen_len=[0.5,4]", f"input={tmp_path}/in.es",
           f"hydra.sweep.dir={tmp_path}/sweep"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "[HYDRA]" not in result.stdout and "Launching 2 jobs locally" in result.stderr
    assert len(result.stdout.splitlines()) == 2  # a line from each job


def test_a_resumed_run_names_the_split_lines_of_its_own_part(caplog) -> None:
    """The lines before a resume were split, and named, by the run that wrote them."""
    records = [
        {"line": 7, "pieces": 3, "cut_without_boundary": False},
        {"line": 9, "pieces": 2, "cut_without_boundary": True},
    ]
    with caplog.at_level(logging.WARNING, logger="specbeam.translate"):
        warn_split(records, 50)
        warn_split(records[:1], 50, resumed_after=5)
    whole, resumed = (r.getMessage() for r in caplog.records)
    assert whole == (
        "split 2 lines longer than 50 source tokens and joined their pieces' translations: "
        "lines 7 (3 pieces), 9 (2 pieces, cut without a boundary)"
    )
    assert resumed == (
        "split 1 line longer than 50 source tokens after line 5 (this run's part) and joined "
        "their pieces' translations: line 7 (3 pieces)"
    )


def test_a_rerun_takes_the_pieces_an_interrupted_run_finished(fuzz_pipeline) -> None:
    """Split lines share length-sorted batches with other lines, so after an interrupt
    nearly every batch holds a piece of some unfinished line: the finished pieces are kept
    (`on_piece`), and the rerun decodes only the batches holding pieces still to do, with
    the same output and records as an uninterrupted run."""
    tokenizer, generators = fuzz_pipeline
    cfg = TranslateConfig(hardware=HardwareConfig(batch_tokens=60, threads=1))
    splitter = Splitter(tokenizer, cfg.task.src_lang, cfg.split_above_tokens)
    lines = [
        "Y dijo Dios: Sea la luz: y fué la luz. " * 6,
        "Hola.",
        "Y vió Dios que la luz era buena. " * 8,
        "",
        "Y llamó Dios a la luz Día. " * 7,
    ]
    counter = _Counter(generators["beam"])
    kept: dict[tuple[int, int], dict] = {}
    whole, records = translate_chunk(
        cfg, tokenizer, counter, splitter, lines, 0, 0,
        on_piece=lambda i, j, piece: kept.__setitem__((i, j), piece),
    )  # fmt: skip
    calls = counter.batches
    pieces = [len(splitter(line).pieces) for line in lines]
    assert pieces[0] > 2 and pieces[2] > 2 and pieces[4] > 2
    # Every piece but the last of each line to finish was kept as it finished.
    assert sorted({i for i, _ in kept}) == [0, 2, 4]
    assert all(sum(1 for i, _ in kept if i == line) == pieces[line] - 1 for line in (0, 2, 4))

    # Interrupted with line 2 unfinished: all of its pieces but the last one kept.
    counter.batches = 0
    again, again_records = translate_chunk(
        cfg, tokenizer, counter, splitter, lines, 0, 0, finished={0, 1, 3, 4},
        finished_pieces={key: kept[key] for key in kept if key[0] == 2},
    )  # fmt: skip
    assert counter.batches == 1 < calls
    assert again[2] == whole[2]
    assert {k: v for k, v in again_records[2].items() if k != "batch_seconds"} == {
        k: v for k, v in records[2].items() if k != "batch_seconds"
    }
