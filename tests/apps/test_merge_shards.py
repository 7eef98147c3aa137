"""`python -m specbeam.merge_shards`: shard files found by name and joined in shard order,
or a one-line error naming the shard that is missing or has the wrong lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specbeam.apps.merge_shards import main as merge_shards

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Five input lines; out.en's three shards own lines 1, 2-3 and 4-5."""
    source = tmp_path / "src.es"
    source.write_text("uno\ndos\n\ncuatro\ncinco\n")
    for i, lines in enumerate(["one\n", "two\n\n", "four\nfive\n"]):
        (tmp_path / f"out.en.shard-{i}-of-3").write_text(lines)
    return source


def error_of(main, *argv: str) -> str:  # noqa: ANN001
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return str(exit_info.value.code)


def test_found_shards_join_in_order(corpus: Path) -> None:
    output = corpus.with_name("out.en")
    merge_shards(["--input", str(corpus), "--output", str(output)])
    assert output.read_text() == "one\ntwo\n\nfour\nfive\n"
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
