"""`python -m specbeam.merge_shards`: shard files found by name and joined in shard order,
or a one-line error naming the shard that is missing, has the wrong lines, or comes from
another run (its record: another input or other settings)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specbeam.apps.decoding import DecodingConfig
from specbeam.apps.merge_shards import main as merge_shards
from specbeam.apps.textio import ResumableOutput, input_digest, job_fingerprint
from specbeam.apps.translate import TranslateConfig, output_settings
from specbeam.data.task import TaskConfig

REPO = Path(__file__).resolve().parents[2]
SHARDS = ["one\n", "two\n\n", "four\nfive\n"]
"""The corpus' three shards, translated."""


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Five input lines; out.en's three shards own lines 1, 2-3 and 4-5."""
    source = tmp_path / "src.es"
    source.write_text("uno\ndos\n\ncuatro\ncinco\n")
    for i, lines in enumerate(SHARDS):
        (tmp_path / f"out.en.shard-{i}-of-3").write_text(lines)
    return source


def finish_shard(source: Path, i: int, text: str, **settings: Any) -> Path:
    """Shard i of out.en's three as translate finishes it, record included (translate's
    job and writer, without a model); `settings` replace TranslateConfig's defaults."""
    output = str(source.with_name("out.en"))
    cfg = TranslateConfig(input=str(source), output=output, shard=f"{i}/3", **settings)
    path = source.with_name(f"out.en.shard-{i}-of-3")
    out = ResumableOutput(
        str(path),
        job_fingerprint(cfg.input, input_digest(source.read_bytes()), output_settings(cfg)),
        record=True,
    )
    out.write(text.splitlines())
    out.finish()
    return path


def error_of(main, *argv: str) -> str:  # noqa: ANN001
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return str(exit_info.value.code)


def test_found_shards_join_in_order(corpus: Path, capsys) -> None:
    output = corpus.with_name("out.en")
    merge_shards(["--input", str(corpus), "--output", str(output)])
    assert output.read_text() == "one\ntwo\n\nfour\nfive\n"
    assert capsys.readouterr().err.endswith(f"wrote {output}: 5 lines from 3 shards\n")
    assert len(list(corpus.parent.glob("out.en.shard-*-of-3"))) == 3  # kept


def test_named_shards_join_in_the_order_given(corpus: Path) -> None:
    named = [corpus.with_name(f"out.en.shard-{i}-of-3") for i in range(3)]
    output = corpus.with_name("joined.en")
    merge_shards(["--input", str(corpus), "--output", str(output), *map(str, named)])
    assert output.read_text() == "one\ntwo\n\nfour\nfive\n"


def test_missing_or_wrong_shards_are_one_line_errors(corpus: Path) -> None:
    args = ["--input", str(corpus), "--output", str(corpus.with_name("out.en"))]
    corpus.with_name("out.en.shard-1-of-3").write_text("two\n")
    assert error_of(merge_shards, *args) == (
        f"error: shard 1/3: {corpus.parent}/out.en.shard-1-of-3 has 1 line, expected 2 "
        f"(lines 2–3 of {corpus})"
    )
    corpus.with_name("out.en.shard-1-of-3").unlink()
    assert error_of(merge_shards, *args).startswith(
        f"error: shard 1/3: {corpus.parent}/out.en.shard-1-of-3 does not exist (is it still running?"
    )
    corpus.with_name("out.en.shard-0-of-2").write_text("one\ntwo\n")
    assert "has shards of several splits (of 2, 3)" in error_of(merge_shards, *args)
    other = ["--input", str(corpus), "--output", str(corpus.with_name("none.en"))]
    assert error_of(merge_shards, *other).startswith(
        f"error: no shard files {corpus.parent}/none.en.shard-i-of-n"
    )
    assert not corpus.with_name("out.en").exists()


def test_a_shard_being_rewritten_or_given_out_of_order_is_refused(corpus: Path) -> None:
    """A .partial beside a finished shard: a newer run of it is going or was interrupted,
    and the finished file may be an older job's. The names say each file's place."""
    args = ["--input", str(corpus), "--output", str(corpus.with_name("out.en"))]
    partial = corpus.with_name("out.en.shard-1-of-3.partial")
    partial.write_text("two\n")
    assert error_of(merge_shards, *args) == (
        f"error: shard 1/3: {partial} exists: a run of this shard is still going or was "
        f"interrupted (run it again to finish it); {corpus.parent}/out.en.shard-1-of-3 may "
        "be an older job's"
    )
    partial.unlink()
    swapped = [corpus.with_name(f"out.en.shard-{i}-of-3") for i in (1, 0, 2)]
    assert error_of(merge_shards, *args, *map(str, swapped)) == (
        f"error: {swapped[0]} is shard 1/3, given as shard 0/3: name the shard files in "
        "order 0, 1, …"
    )
    unwritable = ["--input", str(corpus), "--output", str(corpus.with_name("no_dir") / "out.en")]
    assert error_of(merge_shards, *unwritable, *(str(p) for p in sorted(swapped))).startswith(
        f"error: cannot write --output {corpus.parent}/no_dir/out.en: "
    )
    assert not corpus.with_name("out.en").exists()


def test_the_package_carries_the_merge(corpus: Path, tmp_path: Path) -> None:
    """A pip install has no scripts/: the merge runs as a module of the package, from
    any directory."""
    output = corpus.with_name("out.en")
    cmd = [sys.executable, "-m", "specbeam.merge_shards", "--input", str(corpus),
           "--output", str(output)]  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run(cmd, cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert output.read_text() == "one\ntwo\n\nfour\nfive\n"


def test_shards_of_different_runs_are_refused_naming_the_settings_that_differ(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shard 1 translated again with decoding=beam, then with long lines left unsplit:
    the join would mix runs. Translated again as the others were, the shards join."""
    args = ["--input", str(corpus), "--output", str(corpus.with_name("out.en"))]
    first, _, _ = (finish_shard(corpus, i, text) for i, text in enumerate(SHARDS))
    beam = DecodingConfig(name="beam", speculative=False)
    other = finish_shard(corpus, 1, SHARDS[1], decoding=beam)
    assert error_of(merge_shards, *args) == (
        f"error: {first} and {other} come from different runs: decoding spec_beam vs beam; "
        "translate every shard with the same settings"
    )
    finish_shard(corpus, 1, SHARDS[1], split_above_tokens=0)
    assert error_of(merge_shards, *args).startswith(
        f"error: {first} and {other} come from different runs: split_above_tokens 50 vs 0; "
    )
    assert not corpus.with_name("out.en").exists()
    # Another install's task data_dir (an absolute path translate does not read) joins.
    elsewhere = TaskConfig(data_dir="/elsewhere/tasks/bible_es_en/data")
    finish_shard(corpus, 1, SHARDS[1], task=elsewhere)
    capsys.readouterr()
    merge_shards(args)
    assert corpus.with_name("out.en").read_text() == "".join(SHARDS)
    out = corpus.with_name("out.en")
    assert capsys.readouterr().err == f"wrote {out}: 5 lines from 3 shards\n"  # no warning
    finish_shard(corpus, 1, SHARDS[1], task=TaskConfig(tgt_lang="fra_Latn"))
    assert "task.tgt_lang eng_Latn vs fra_Latn" in error_of(merge_shards, *args)


def test_a_shard_of_another_input_or_place_is_refused(corpus: Path) -> None:
    """The input edited after shard 0 was translated (the same number of lines, so the
    shards' lines alone cannot tell), and a shard's files copied over another's."""
    args = ["--input", str(corpus), "--output", str(corpus.with_name("out.en"))]
    old = hashlib.sha256(corpus.read_bytes()).hexdigest()
    shard = finish_shard(corpus, 0, SHARDS[0])
    corpus.write_text("uno\ndos\n\ncuatro\nseis\n")
    new = hashlib.sha256(corpus.read_bytes()).hexdigest()
    for i in (1, 2):
        finish_shard(corpus, i, SHARDS[i])
    assert error_of(merge_shards, *args) == (
        f"error: shard 0/3: {shard} was translated from other text than --input {corpus} "
        f"(input={corpus} with sha256 {old[:12]}…, not {new[:12]}…): translate it again "
        "from this input"
    )
    finish_shard(corpus, 0, SHARDS[0])
    copied = corpus.with_name("out.en.shard-1-of-3.json")
    shutil.copy(corpus.with_name("out.en.shard-2-of-3.json"), copied)
    assert error_of(merge_shards, *args) == (
        f"error: shard 1/3: {copied} records shard 2/3: {corpus.parent}/out.en.shard-1-of-3 is "
        "another shard's output renamed or copied; translate shard 1/3 again"
    )
    copied.write_text('{"settings": ')
    assert error_of(merge_shards, *args) == (
        f"error: shard 1/3: {copied} is not a record translate wrote: delete it to join "
        f"{corpus.parent}/out.en.shard-1-of-3 unchecked"
    )
    assert not corpus.with_name("out.en").exists()


def test_a_shard_without_a_record_is_joined_with_a_warning(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shard an older specbeam finished has no record: the others are still checked."""
    for i in (0, 2):
        finish_shard(corpus, i, SHARDS[i])
    output = corpus.with_name("out.en")
    merge_shards(["--input", str(corpus), "--output", str(output)])
    assert output.read_text() == "".join(SHARDS)
    shard = corpus.with_name("out.en.shard-1-of-3")
    assert capsys.readouterr().err == (
        f"warning: shard 1/3: {shard} has no record {shard}.json (written by an older "
        "specbeam?): not checked against the input and the other shards' settings\n"
        f"wrote {output}: 5 lines from 3 shards\n"
    )
